"""Errors the engine raises for input it will not serve (the server maps them to HTTP 400)."""

from __future__ import annotations


class EngineInputError(ValueError):
    """A request the engine rejects before scheduling it; ``param`` names the culprit."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class EngineConfigError(ValueError):
    """An engine configuration that cannot work (e.g. the KV budget holds no full sequence)."""


class RequestFailedError(RuntimeError):
    """One request failed inside the engine (its grammar, sampling, detokenizing); the
    engine and every other request went on."""


class AdapterError(ValueError):
    """A LoRA adapter this engine cannot serve: missing files, unsupported settings, a shape
    its base does not have, a name in use, or no free slot."""
