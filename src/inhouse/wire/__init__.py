"""The wire formats the gateway and the bench both speak: OpenAI streams and answers,
Prometheus exposition, bearer auth and OpenAI error bodies. No engine, no HTTP server."""
