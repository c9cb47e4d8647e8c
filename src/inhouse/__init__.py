"""inhouse: run an open-weight LLM on your own machines as an OpenAI-compatible service."""

__version__ = "0.1.0"
