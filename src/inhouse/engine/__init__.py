"""Batching inference engine: paged KV cache, continuous batching. Knows nothing of HTTP."""
