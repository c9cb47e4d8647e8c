"""HTTP plumbing shared by the server, the gateway and the bench: the request-body cap,
OpenAI error responses on every path, a lean HTTP/1.1 client and Prometheus scraping."""
