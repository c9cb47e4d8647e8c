"""Step 2 of a request: its JSON body read into the model route and what it needs, or a 4xx
when the body is bad, the model is unknown to the key, or no upstream of it could ever serve
the request. No tokenizer is needed.

Two prompt figures: `prompt_tokens`, an estimate (characters/4 + 4 per message) for the
context check and the prompt-size metric, and `prompt_bound`, an upper bound for token
reservations when the backend cannot count exactly (UTF-8 bytes + `TEMPLATE_TOKENS` per
message: byte-level BPE and byte-fallback tokenizers never make more tokens than bytes, and
the bound leaves that many tokens per message for the chat template's markup). Both sum
over a batch (a completions or embeddings list); the context must hold each of its prompts
alone, so the context checks take the longest one's (`longest`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from inhouse.api.chat import ChatFields
from inhouse.api.common import RequestModel
from inhouse.api.completions import CompletionRequest
from inhouse.api.errors import invalid_fields, invalid_request, not_found
from inhouse.api.image_url import ImageRefused, images_limit_message
from inhouse.gateway.adapters.served import base_of
from inhouse.gateway.config import GatewayConfig, ModelRoute
from inhouse.gateway.endpoints import ENDPOINTS, Endpoint
from inhouse.gateway.images import count_images
from inhouse.gateway.keys import ApiKey
from inhouse.gateway.needs import Needs
from inhouse.gateway.priority import DEFAULT_CLASS, BadPriority, effective_class
from inhouse.gateway.routing import Router

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4
TEMPLATE_TOKENS = 64


class BadRequest(ValueError):
    """The body is not a request we can route; answered with 400."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def read_needs(
    endpoint: str, body: dict[str, Any], image_hosts: frozenset[str] = frozenset()
) -> Needs:
    """Inspect an OpenAI request body for the capabilities and tokens it needs (its image
    parts checked first, so a misspelt one gets its own message; http(s) image URLs only
    on `image_hosts`)."""
    route = ENDPOINTS[endpoint]
    images = 0
    if route.prompt == "messages" and isinstance(body.get("messages"), list):
        try:
            images = count_images(body["messages"], image_hosts)
        except ImageRefused as err:
            raise BadRequest(str(err), err.param) from None
    fields = _checked_fields(route, body)
    features = {route.feature}
    longest: tuple[int, int] | None = None
    param = route.prompt
    if param == "messages":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list", "messages")
        chars, size = _message_chars(messages)
        prompt = math.ceil(chars / CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(messages)
        bound = size + TEMPLATE_TOKENS * len(messages)
        if images:
            features.add("vision")
        if body.get("tools"):
            features.add("tools")
            tools = json.dumps(body["tools"])
            prompt += math.ceil(len(tools) / CHARS_PER_TOKEN)
            bound += tools_bound(body)
        response_format = body.get("response_format")
        if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
            features.add("json_schema")
    elif param is not None:  # a completions prompt or an embeddings input
        parts = _input_parts(body.get(param), param)
        prompt, bound = sum(p[0] for p in parts), sum(p[1] for p in parts)
        if len(parts) > 1:
            longest = (max(p[0] for p in parts), max(p[1] for p in parts))
    else:  # tokenize and detokenize run no model: nothing to reserve
        prompt = bound = 0
    output: int | None = 0  # embeddings and tokenizing generate nothing
    choices = 1
    if isinstance(fields, ChatFields | CompletionRequest):
        output = fields.completion_limit if output_param(body)[1] is not None else None
        choices = fields.n
    if isinstance(fields, CompletionRequest):  # every prompt shape: text, ids, or a batch
        choices *= len(fields.prompts())
    return Needs(frozenset(features), prompt, output, choices, bound, longest, images)


def _checked_fields(endpoint: Endpoint, body: dict[str, Any]) -> RequestModel:
    """The body's fields checked against the ranges of `inhouse.api.bounds`. ``stream`` is
    written back as the bool it means ("false" is false), so the gateway and the backend
    agree on whether the answer is a stream."""
    # `priority` is the gateway's to read (a class name too: `priority.effective_class`),
    # and the client's own value never reaches a backend (`exchange.prepare`).
    checked = body
    if "priority" in body:
        checked = {name: value for name, value in body.items() if name != "priority"}
    try:
        fields = endpoint.fields.model_validate(checked)
    except ValidationError as err:
        refused = invalid_fields(err.errors())
        raise BadRequest(refused.message, refused.param) from None
    if "stream" in body:
        body["stream"] = getattr(fields, "stream", False)
    return fields


def output_param(body: dict[str, Any]) -> tuple[str, Any]:
    """Which output cap the request gives (`max_completion_tokens` first; null is absent)."""
    for param in ("max_completion_tokens", "max_tokens"):
        if body.get(param) is not None:
            return param, body[param]
    return "max_tokens", None


def tools_bound(body: dict[str, Any]) -> int:
    """Upper bound of the tokens the tool definitions add to a chat prompt."""
    tools = body.get("tools")
    return len(json.dumps(tools).encode()) + TEMPLATE_TOKENS if tools else 0


def _message_chars(messages: list[Any]) -> tuple[int, int]:
    """Characters and UTF-8 bytes of the messages' text."""
    chars = size = 0
    for message in messages:
        if not isinstance(message, dict):
            raise BadRequest("each message must be an object", "messages")
        texts = [message.get("content")]
        if isinstance(texts[0], list):
            parts = [p for p in texts[0] if isinstance(p, dict)]
            texts = [str(p.get("text", "")) for p in parts if p.get("type") == "text"]
        for key in ("tool_calls", "name", "tool_call_id"):
            if message.get(key):
                texts.append(json.dumps(message[key]))
        for text in texts:
            if isinstance(text, str):
                chars += len(text)
                size += _utf8_size(text)
    return chars, size


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _input_parts(value: Any, param: str) -> list[tuple[int, int]]:
    """Estimate and upper bound of each prompt of a completions `prompt` or embeddings
    `input` (one for text or token ids, one per element of a batch)."""
    if isinstance(value, str):
        return [(math.ceil(len(value) / CHARS_PER_TOKEN), _utf8_size(value) + TEMPLATE_TOKENS)]
    if isinstance(value, list) and value:
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return [(len(value), len(value))]
        return [part for v in value for part in _input_parts(v, param)]
    raise BadRequest(f"'{param}' must be a string, a list of strings, or token ids", param)


@dataclass(frozen=True, slots=True)
class Parsed:
    """A request the gateway understood and some upstream of its model can serve."""

    endpoint: str
    body: dict[str, Any]
    route: ModelRoute
    needs: Needs
    priority: str = DEFAULT_CLASS  # its effective class (see `priority.effective_class`)
    adapter: str | None = None  # the LoRA adapter it asks for, on `route` (`adapters`)


def model_name(body: dict[str, Any]) -> str | None:
    """The body's `model` when it is a string."""
    model = body.get("model")
    return model if isinstance(model, str) else None


def parse(
    config: GatewayConfig, router: Router, key: ApiKey, endpoint: str, body: dict[str, Any],
    model: str | None,
) -> Parsed:  # fmt: skip
    """The route and needs of `body` (asking for `model`, see `model_name`) on `endpoint`;
    APIError (400 or 404) when refused. A `model` that names an adapter is routed to its
    base model (`adapters.served`)."""
    route, adapter = _route(config, router, key, model)
    try:
        needs = read_needs(endpoint, body, config.image_url_hosts)
    except BadRequest as err:
        raise invalid_request(str(err), err.param) from None
    gap = router.capability_gap(route, needs, key.allow_fallback)
    if gap is not None:
        raise invalid_request(f"{gap} (model {route.name!r})", code="unsupported_capability")
    for limit, whose, setting in (
        (key.max_images, "this key", "max_images"),
        (route.images_per_prompt, f"model {route.name!r}", "images_per_prompt"),
    ):
        if limit is not None and needs.images > limit:
            message = images_limit_message(needs.images, limit, whose, setting)
            raise invalid_request(message, "messages", code="too_many_images")
    try:
        priority = effective_class(key.priority, body)
    except BadPriority as err:
        raise invalid_request(str(err), "priority") from None
    return Parsed(endpoint, body, route, needs, priority, adapter)


def _route(
    config: GatewayConfig, router: Router, key: ApiKey, model: str | None
) -> tuple[ModelRoute, str | None]:
    """The model route asked for, and the adapter when `model` names one (its base model
    must be one the key may use)."""
    if model is None:
        raise invalid_request("'model' is required", "model")
    route, adapter = config.model(model), None
    if route is None:
        route, adapter = base_of(router, model), model
    if route is None or not key.may_use(route.name):
        raise not_found(
            f"The model '{model}' does not exist or you do not have access to it.",
            "model",
            "model_not_found",
        )
    return route, adapter
