"""What a request needs from a backend, read from its body without a tokenizer."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from inhouse.api.chat import ChatFields
from inhouse.api.common import RequestModel
from inhouse.api.completions import CompletionRequest
from inhouse.api.embeddings import EmbeddingRequest
from inhouse.api.errors import invalid_fields
from inhouse.api.tokenize import DetokenizeRequest, TokenizeRequest
from inhouse.gateway.config import Upstream

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4

# What the gateway checks of each body before it forwards it: the same fields and ranges
# `inhouse serve` checks (chat messages are left to the backend, which may take more kinds).
ENDPOINT_FIELDS: dict[str, type[RequestModel]] = {
    "chat/completions": ChatFields,
    "completions": CompletionRequest,
    "embeddings": EmbeddingRequest,
    "tokenize": TokenizeRequest,
    "detokenize": DetokenizeRequest,
}
ENDPOINT_FEATURE = {
    "chat/completions": "chat",
    "completions": "completions",
    "embeddings": "embeddings",
    "tokenize": "chat",  # the chat model's tokenizer, at the backend's own /tokenize
    "detokenize": "chat",
}


class BadRequest(ValueError):
    """The body is not a request we can route; answered with 400."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class Needs:
    """Features, an estimate of prompt tokens, and the output the request may produce."""

    features: frozenset[str]
    prompt_tokens: int
    max_output: int | None
    choices: int

    def reserve(self, default_max_tokens: int) -> int:
        """Tokens to reserve at admission: prompt estimate + max_tokens per choice."""
        output = self.max_output if self.max_output is not None else default_max_tokens
        return self.prompt_tokens + output * self.choices


def read_needs(endpoint: str, body: dict[str, Any]) -> Needs:
    """Inspect an OpenAI request body for the capabilities and tokens it needs."""
    fields = _checked_fields(endpoint, body)
    features = {ENDPOINT_FEATURE[endpoint]}
    if endpoint == "chat/completions":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list", "messages")
        chars, images = _message_chars(messages)
        prompt = math.ceil(chars / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(messages)
        if images:
            features.add("vision")
        if body.get("tools"):
            features.add("tools")
            prompt += math.ceil(len(json.dumps(body["tools"])) / CHARS_PER_TOKEN)
        response_format = body.get("response_format")
        if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
            features.add("json_schema")
    elif endpoint == "completions":
        prompt = _input_tokens(body.get("prompt"), "prompt")
    elif endpoint == "embeddings":
        prompt = _input_tokens(body.get("input"), "input")
    else:  # tokenize and detokenize run no model: nothing to reserve
        prompt = 0
    output: int | None = 0
    if isinstance(fields, ChatFields):
        output = fields.completion_limit
    elif isinstance(fields, CompletionRequest):
        output = fields.max_tokens if "max_tokens" in body else None
    return Needs(frozenset(features), prompt, output, getattr(fields, "n", 1))


def _checked_fields(endpoint: str, body: dict[str, Any]) -> RequestModel:
    """The body's fields checked against the ranges of `inhouse.api.bounds`. ``stream`` is
    written back as the bool it means ("false" is false), so the gateway and the backend
    agree on whether the answer is a stream."""
    try:
        fields = ENDPOINT_FIELDS[endpoint].model_validate(body)
    except ValidationError as err:
        refused = invalid_fields(err.errors())
        raise BadRequest(refused.message, refused.param) from None
    if "stream" in body:
        body["stream"] = getattr(fields, "stream", False)
    return fields


def refusal(upstream: Upstream, needs: Needs) -> str | None:
    """Why this upstream cannot serve the request, or None if it can."""
    caps = upstream.capabilities
    missing = sorted(needs.features - caps.features)
    if missing:
        return f"model does not support {', '.join(missing)}"
    out = needs.max_output
    if caps.max_output is not None and out is not None and out > caps.max_output:
        return f"max_tokens {needs.max_output} exceeds the model's output limit {caps.max_output}"
    total = needs.prompt_tokens + (needs.max_output or 0)
    if caps.max_context is not None and total > caps.max_context:
        return (
            f"prompt (~{needs.prompt_tokens} tokens) + max_tokens ({needs.max_output or 0})"
            f" exceeds the model's context of {caps.max_context} tokens"
        )
    return None


def _message_chars(messages: list[Any]) -> tuple[int, bool]:
    chars, images = 0, False
    for message in messages:
        if not isinstance(message, dict):
            raise BadRequest("each message must be an object", "messages")
        content = message.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text":
                    chars += len(str(part.get("text", "")))
                elif kind in ("image_url", "input_image", "image"):
                    images = True
        if message.get("tool_calls"):
            chars += len(json.dumps(message["tool_calls"]))
    return chars, images


def _input_tokens(value: Any, param: str) -> int:
    if isinstance(value, str):
        return math.ceil(len(value) / CHARS_PER_TOKEN)
    if isinstance(value, list) and value:
        if all(isinstance(v, int) for v in value):
            return len(value)
        return sum(_input_tokens(v, param) for v in value)
    raise BadRequest(f"'{param}' must be a string, a list of strings, or token ids", param)
