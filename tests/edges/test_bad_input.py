"""Bad input a careless client sends, straight to `inhouse serve` and through the gateway:
a body that is not an object, fields past a bound, settings the server owns, a null for
a default. Each gets a 400 in OpenAI's shape saying in our words what was wrong (no
pydantic, xgrammar or transformers internals), or the answer the documented default
gives."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from inhouse.api import bounds

if TYPE_CHECKING:  # the fixture's types; conftest is not a module to import at run time
    from conftest import Edges, Target

pytestmark = pytest.mark.slow

POSTS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/tokenize", "/detokenize"]
NOT_OBJECTS = [b"null", b"0", b"-1.5e3", b"true", b'"text"', b"[]", b'[{"model": "x"}]']
INTERNALS = ("constrained", "list[", "literal[", "pydantic", ".cc", "/project/", "apply_chat")
HI = [{"role": "user", "content": "Say hi."}]


def _error(response: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize("via", ["serve", "gateway"])
def test_a_body_that_is_not_an_object_is_400_on_every_post_route(edges: Edges, via: str) -> None:
    target = getattr(edges, via)
    headers = {**target.headers, "Content-Type": "application/json"}
    with httpx.Client(base_url=target.url, headers=headers, timeout=30) as http:
        for path in POSTS:
            for raw in NOT_OBJECTS:
                error = _error(http.post(path, content=raw))
                assert error["message"] == "The request body must be a JSON object.", (path, raw)


def _refused(target: Target) -> list[tuple[str, dict[str, Any], str, str]]:
    """(path, body, param, what the message says) of requests each target refuses."""
    chat, emb = target.chat_model, target.embedding_model
    unsupported = {"name": "x", "schema": {"type": "nonsense"}}
    long_stop = "x" * (bounds.MAX_STOP_STRING_CHARS + 1)
    prompts = ["hi"] * (bounds.MAX_COMPLETION_PROMPTS + 1)

    def chat_body(**fields: Any) -> dict[str, Any]:
        return {"model": chat, "messages": HI, "max_tokens": 4, **fields}

    return [
        ("/v1/chat/completions", chat_body(stop=["a"] * 17), "stop", "at most 16 items"),
        ("/v1/chat/completions", chat_body(stop=""), "stop", "must not be empty"),
        ("/v1/chat/completions", chat_body(stop=long_stop), "stop", "at most 256 characters"),
        ("/v1/completions", {"model": chat, "prompt": prompts}, "prompt", "at most 256 items"),
        ("/v1/embeddings", {"model": emb, "input": ["a"] * 2049}, "input", "at most 2048"),
        (
            "/v1/chat/completions",
            chat_body(response_format={"type": "json_schema", "json_schema": unsupported}),
            "response_format",
            'cannot be enforced: Unsupported type "nonsense"',
        ),
        (
            "/v1/chat/completions",
            chat_body(chat_template_kwargs={"add_generation_prompt": False}),
            "chat_template_kwargs",
            "cannot set 'add_generation_prompt'",
        ),
    ]


@pytest.mark.parametrize("via", ["serve", "gateway"])
def test_refusals_say_what_the_client_did_wrong_in_our_words(edges: Edges, via: str) -> None:
    target = getattr(edges, via)
    with httpx.Client(base_url=target.url, headers=target.headers, timeout=60) as http:
        for path, body, param, says in _refused(target):
            error = _error(http.post(path, json=body))
            assert error["param"] == param and says in error["message"], error
            assert not any(internal in error["message"] for internal in INTERNALS), error


def _generated(target: Target, path: str, body: dict[str, Any]) -> int:
    raw = json.dumps({"model": target.chat_model, "ignore_eos": True, **body}).encode()
    headers = {**target.headers, "Content-Type": "application/json"}
    response = httpx.post(f"{target.url}{path}", content=raw, headers=headers, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["usage"]["completion_tokens"]


def test_an_explicit_null_output_cap_is_the_cap_left_out(edges: Edges) -> None:
    """On serve (the gateway replaces a null or absent cap by its default_max_tokens)."""
    target = edges.serve
    completions = {"prompt": "Once upon a time"}
    absent = _generated(target, "/v1/completions", completions)
    assert absent == bounds.DEFAULT_COMPLETIONS_MAX_TOKENS
    for name in ("max_tokens", "max_completion_tokens"):
        assert _generated(target, "/v1/completions", {**completions, name: None}) == absent
    chat = {"messages": HI}
    absent = _generated(target, "/v1/chat/completions", chat)
    sent_null = _generated(target, "/v1/chat/completions", {**chat, "max_completion_tokens": None})
    assert sent_null == absent
