"""A refused field is told in our words, the same by `inhouse serve`'s request models and
the gateway's check; a field sent as null is the field left out."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from inhouse.api import bounds
from inhouse.api.body import NOT_AN_OBJECT
from inhouse.api.chat import ChatCompletionRequest
from inhouse.api.completions import CompletionRequest
from inhouse.api.embeddings import EmbeddingRequest
from inhouse.api.errors import invalid_fields
from inhouse.gateway.parsing import BadRequest, read_needs

HI = [{"role": "user", "content": "hi"}]
MODELS = {
    "chat/completions": ChatCompletionRequest,
    "completions": CompletionRequest,
    "embeddings": EmbeddingRequest,
}
# Pydantic's names of union members and dict keys, which no client should read.
INTERNALS = ("constrained", "list[", "tagged-union", "literal[", "[key]", ".str'", "pydantic")
TOO_MANY_PROMPTS = bounds.MAX_COMPLETION_PROMPTS + 1
LONG_STOP = "x" * (bounds.MAX_STOP_STRING_CHARS + 1)


def _serve_refusal(endpoint: str, body: dict[str, Any]) -> tuple[str, str | None]:
    with pytest.raises(ValidationError) as refused:
        MODELS[endpoint].model_validate(body)
    error = invalid_fields(refused.value.errors())
    return error.message, error.param


def _gateway_refusal(endpoint: str, body: dict[str, Any]) -> tuple[str, str | None]:
    with pytest.raises(BadRequest) as refused:
        read_needs(endpoint, body)
    return str(refused.value), refused.value.param


@pytest.mark.parametrize(
    ("endpoint", "body", "param", "says"),
    [
        ("chat/completions", {"stop": ["a"] * 17}, "stop", "at most 16 items, not 17"),
        ("chat/completions", {"stop": ""}, "stop", "'stop': must not be empty"),
        ("chat/completions", {"stop": ["a", ""]}, "stop", "'stop.1': must not be empty"),
        ("chat/completions", {"stop": 5}, "stop", "must be a string or a list"),
        ("chat/completions", {"stop": LONG_STOP}, "stop", "at most 256 characters"),
        ("chat/completions", {"stop": ["a", LONG_STOP]}, "stop", "'stop.1': must be at most"),
        ("chat/completions", {"logit_bias": {"x": 1}}, "logit_bias", "must be an integer"),
        ("completions", {"prompt": ["a"] * TOO_MANY_PROMPTS}, "prompt", "at most 256 items"),
        ("completions", {"prompt": [[5]] * TOO_MANY_PROMPTS}, "prompt", "at most 256 items"),
        ("completions", {"prompt": [5, -1]}, "prompt", "'prompt.1': must be at least 0"),
        ("completions", {"prompt": 5}, "prompt", "must be a string or a list"),
        ("embeddings", {"input": ["a"] * 2049}, "input", "at most 2048 items, not 2049"),
        ("embeddings", {"input": [""]}, "input", "'input.0': must not be empty"),
        ("embeddings", {"input": [[]]}, "input", "'input.0': must not be empty"),
    ],
)
def test_serve_and_gateway_say_what_the_client_did_wrong(
    endpoint: str, body: dict[str, Any], param: str, says: str
) -> None:
    base = {"messages": HI} if endpoint == "chat/completions" else {}
    if endpoint == "completions" and "prompt" not in body:
        base = {"prompt": "x"}
    for refusal in (_serve_refusal, _gateway_refusal):
        message, named = refusal(endpoint, {**base, **body})
        assert named == param and says in message, (refusal.__name__, message)
        assert not any(internal in message for internal in INTERNALS), message


def test_serve_names_chat_only_fields_by_their_place_not_their_union_member() -> None:
    """(The gateway leaves messages and tools to the backend.)"""
    message, param = _serve_refusal("chat/completions", {"messages": HI, "tool_choice": "x"})
    assert message == "Invalid value for 'tool_choice': must be 'none', 'auto' or 'required'."
    assert param == "tool_choice"
    bad_part = {"messages": [{"role": "user", "content": [{"type": "text"}]}]}
    message, param = _serve_refusal("chat/completions", bad_part)
    assert message == "'messages.0.content.0.text' is a required property." and param == "messages"
    unknown = {"messages": [{"role": "user", "content": [{"type": "video"}]}]}
    message, _ = _serve_refusal("chat/completions", unknown)
    assert "'messages.0.content.0'" in message and "'video'" in message


@pytest.mark.parametrize("key", ["tools", "messages", "add_generation_prompt", "tokenize"])
def test_chat_template_kwargs_cannot_set_what_the_server_passes(key: str) -> None:
    body = {"messages": HI, "chat_template_kwargs": {key: True}}
    message, param = _serve_refusal("chat/completions", body)
    assert param == "chat_template_kwargs" and f"cannot set {key!r}" in message
    assert "apply_chat_template" not in message
    allowed = {"messages": HI, "chat_template_kwargs": {"enable_thinking": False}}
    assert ChatCompletionRequest.model_validate(allowed).chat_template_kwargs


@pytest.mark.parametrize("body", [None, 1, 1.5, True, "text", [], [{"messages": HI}]])
def test_a_body_that_is_not_an_object_is_refused_in_words(body: Any) -> None:
    for endpoint in MODELS:
        message, param = _serve_refusal(endpoint, body)
        assert message == NOT_AN_OBJECT and param is None


def test_null_is_the_field_left_out() -> None:
    for name in ("max_tokens", "max_completion_tokens"):
        sent_null = CompletionRequest.model_validate({"prompt": "x", name: None})
        assert sent_null.completion_limit == bounds.DEFAULT_COMPLETIONS_MAX_TOKENS
        chat = ChatCompletionRequest.model_validate({"messages": HI, name: None})
        assert chat.completion_limit == ChatCompletionRequest(messages=HI).completion_limit
        gateway = read_needs("completions", {"prompt": "x", name: None})
        assert gateway.max_output is None  # absent: the gateway sends its own default
    nulls = {"n": None, "stream": None, "ignore_eos": None, "min_tokens": None, "echo": None}
    request = CompletionRequest.model_validate({"prompt": "x", **nulls})
    assert request.model_dump() == CompletionRequest(prompt="x").model_dump()
    assert read_needs("completions", {"prompt": "x", **nulls}).choices == 1
