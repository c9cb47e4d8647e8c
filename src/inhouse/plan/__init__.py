"""Memory accounting before deployment: weights + KV cache + overhead. Imports no torch."""
