"""LoRA adapters behind the gateway: which replicas serve each one (`served`, kept as the
replicas list them by `sync`), who may use it (`policy`), and loading and unloading them at
run time (`admin`).

An adapter is asked for by name as a request's `model`; it runs on its base model's
replicas that serve it, and the name is sent upstream as the `model` (vLLM's and
`inhouse serve`'s shape)."""
