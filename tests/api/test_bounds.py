"""One set of ranges at the edge: `inhouse serve`'s request models and the gateway's check
accept the same values and refuse the same ones, at each bound and one step past it."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from inhouse.api import bounds
from inhouse.api.body import json_object, tree_problem
from inhouse.api.chat import ChatCompletionRequest
from inhouse.api.errors import APIError
from inhouse.gateway.parsing import BadRequest, read_needs

HI = [{"role": "user", "content": "hi"}]
EDGES = [  # (field, the last value accepted, the first refused)
    ("max_tokens", bounds.MAX_OUTPUT_TOKENS, bounds.MAX_OUTPUT_TOKENS + 1),
    ("max_tokens", 1, 0),
    ("max_completion_tokens", bounds.MAX_OUTPUT_TOKENS, 2**63),
    ("n", bounds.MAX_N, bounds.MAX_N + 1),
    ("top_k", bounds.MAX_TOP_K, 2**63),
    ("top_k", -1, -2),
    ("seed", bounds.INT64_MAX, 2**64),
    ("seed", bounds.INT64_MIN, -(2**63) - 1),
    ("temperature", bounds.TEMPERATURE_MAX, 2.01),
    ("top_p", 1.0, 0.0),
    ("min_p", 1.0, 1.5),
    ("presence_penalty", -2.0, -2.5),
    ("frequency_penalty", 2.0, float("inf")),
    ("repetition_penalty", bounds.REPETITION_PENALTY_MAX, 0.0),
    ("min_tokens", bounds.MAX_OUTPUT_TOKENS, -1),
    ("top_logprobs", bounds.MAX_LOGPROBS, bounds.MAX_LOGPROBS + 1),
    ("logit_bias", {str(bounds.MAX_TOKEN_ID): 100}, {str(2**40): 1}),
    ("logit_bias", {"7": -100}, {"7": 101}),
    ("stop_token_ids", [bounds.MAX_TOKEN_ID], [2**63]),
    ("stream_options", {"include_usage": True}, "yes"),
    ("stream_options", None, [1]),
]


def _serve_accepts(body: dict) -> bool:
    try:
        ChatCompletionRequest.model_validate(body)
    except ValidationError:
        return False
    return True


def _gateway_accepts(body: dict) -> bool:
    try:
        read_needs("chat/completions", body)
    except BadRequest:
        return False
    return True


@pytest.mark.parametrize(("field", "last", "past"), EDGES)
def test_serve_and_gateway_agree_at_each_bound(field: str, last: object, past: object) -> None:
    extra = {"logprobs": True} if field == "top_logprobs" else {}
    accepted = {"messages": HI, field: last, **extra}
    refused = {"messages": HI, field: past, **extra}
    assert _serve_accepts(accepted) and _gateway_accepts(accepted)
    assert not _serve_accepts(refused) and not _gateway_accepts(refused)


def test_lone_surrogates_and_deep_nesting_are_refused_before_any_field() -> None:
    assert tree_problem({"messages": [{"content": "ok é ✓"}]}) is None
    assert "messages.0.content" in str(tree_problem({"messages": [{"content": "\udfff"}]}))
    assert "key" in str(tree_problem({"chat_template_kwargs": {"\ud800": 1}}))
    nested: list = []  # the object around it is one level, this list another
    for _ in range(bounds.MAX_JSON_DEPTH - 2):
        nested = [nested]
    assert tree_problem({"a": nested}) is None
    assert "nested deeper" in str(tree_problem({"a": [nested]}))
    assert not _serve_accepts({"messages": [{"role": "user", "content": "\udfff"}]})
    assert not _gateway_accepts({"messages": [{"role": "user", "content": "\udfff"}]})


@pytest.mark.parametrize(
    "raw", [b"[" * 5000 + b"]" * 5000, b'{"a": ' + b"[" * 100_000 + b"}", b"[1]", b"nope"]
)
def test_json_object_refuses_with_a_400(raw: bytes) -> None:
    with pytest.raises(APIError) as err:
        json_object(raw)
    assert err.value.status_code == 400


def test_json_object_parses_escaped_surrogates_for_the_tree_check_to_refuse() -> None:
    body = json_object(json.dumps({"prompt": "\udfff"}).encode())
    assert tree_problem(body) is not None


def test_the_gateway_forwards_stream_as_the_bool_it_means() -> None:
    body = {"messages": HI, "stream": "false"}
    read_needs("chat/completions", body)
    assert body["stream"] is False
