"""The routes the gateway proxies, one record each: every step of the request path (the
front's dispatch, the OpenAPI document, body checks and needs, admission, the upstream call)
reads this table, so a new proxied route is one line here. The gateway's own routes
(`/health`, `/metrics`, `/v1/models`, the console) are FastAPI's, in `app`."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from inhouse.api.chat import ChatCompletionRequest, ChatFields
from inhouse.api.common import RequestModel
from inhouse.api.completions import CompletionRequest
from inhouse.api.embeddings import EmbeddingRequest
from inhouse.api.tokenize import DetokenizeRequest, TokenizeRequest


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One proxied route.

    `name` is how audit rows, metrics and logs call it; `fields` is what the gateway checks
    of the body (the same fields and ranges `inhouse serve` checks; chat messages are left
    to the backend, which may take more kinds) and `schema` the body the OpenAPI document
    shows; `feature` the capability a backend needs for it; `prompt` the body field holding
    the prompt (None: no prompt to reserve tokens for); `generates` whether it runs the model
    to generate (output cap, cache salt, priority and shadows apply); `metered` whether it
    counts against requests/minute, tokens/minute and quotas. A backend serves it at the
    same `path`."""

    name: str
    path: str
    fields: type[RequestModel]
    schema: type[BaseModel]
    feature: str
    prompt: str | None
    generates: bool
    metered: bool
    method: str = "POST"


# name, path (the gateway's and the backend's), fields, schema, feature, prompt, generates, metered
ENDPOINTS: dict[str, Endpoint] = {
    e.name: e
    for e in (
        Endpoint("chat/completions", "/v1/chat/completions", ChatFields, ChatCompletionRequest, "chat", "messages", True, True),  # noqa: E501
        Endpoint("completions", "/v1/completions", CompletionRequest, CompletionRequest, "completions", "prompt", True, True),  # noqa: E501
        Endpoint("embeddings", "/v1/embeddings", EmbeddingRequest, EmbeddingRequest, "embeddings", "input", False, True),  # noqa: E501
        # tokenizing runs no model: the chat model's tokenizer, at the backend's own /tokenize
        Endpoint("tokenize", "/tokenize", TokenizeRequest, TokenizeRequest, "chat", None, False, False),  # noqa: E501
        Endpoint("detokenize", "/detokenize", DetokenizeRequest, DetokenizeRequest, "chat", None, False, False),  # noqa: E501
    )
}  # fmt: skip
BY_PATH: dict[str, Endpoint] = {e.path: e for e in ENDPOINTS.values()}
