"""Releases of a model: the store, canaries and shadows on the request path, the
guardrail, and the `inhouse release` command with its reports."""
