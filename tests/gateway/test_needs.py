"""Reading a request's needs, and refusing what a backend's capabilities cannot serve."""

from __future__ import annotations

import pytest

from inhouse.gateway.config import Capabilities, Upstream
from inhouse.gateway.needs import missing_capability
from inhouse.gateway.parsing import TEMPLATE_TOKENS, BadRequest, read_needs

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def _upstream(*features: str, context: int | None = None, output: int | None = None) -> Upstream:
    caps = Capabilities(frozenset(features), context, output)
    return Upstream("b", "http://127.0.0.1:1", None, "m", capabilities=caps)


def test_chat_features_and_estimate() -> None:
    body = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 40}, IMAGE]}],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {}}},
        "max_completion_tokens": 20,
        "n": 2,
    }
    needs = read_needs("chat/completions", body)
    assert needs.features == {"chat", "vision", "tools", "json_schema"}
    assert needs.prompt_tokens >= 10 + 4
    assert needs.output_cap(999, None) == 20
    assert needs.reserve(needs.prompt_tokens, 20) == needs.prompt_tokens + 40


def test_prompt_bound_covers_every_byte_and_the_template() -> None:
    text = "日本語 \U0001f600 hi"
    needs = read_needs("chat/completions", {"messages": [{"role": "user", "content": text}]})
    assert needs.prompt_bound == len(text.encode()) + TEMPLATE_TOKENS > needs.prompt_tokens


def test_without_max_tokens_the_cap_is_the_default_within_max_output() -> None:
    for body in ({}, {"max_tokens": None}, {"max_completion_tokens": None, "max_tokens": None}):
        needs = read_needs("chat/completions", {"messages": [{"content": "x"}], **body})
        assert needs.max_output is None
        assert needs.output_cap(64, None) == 64 and needs.output_cap(64, 16) == 16
    given = read_needs("chat/completions", {"messages": [{"content": "x"}], "max_tokens": 7,
                                            "max_completion_tokens": None})  # fmt: skip
    assert given.output_cap(64, 16) == 7


def test_completions_with_token_ids_and_default_max_tokens() -> None:
    needs = read_needs("completions", {"prompt": [1, 2, 3, 4, 5]})
    assert needs.features == {"completions"} and needs.prompt_tokens == 5
    assert needs.prompt_bound == 5
    assert needs.reserve(5, needs.output_cap(100, None)) == 105


@pytest.mark.parametrize(
    ("prompt", "prompts"),
    [("a b", 1), (["a", "b", "c"], 3), ([5, 6, 7], 1), ([[5]] * 100, 100), ([[5, 6], [7]], 2)],
)
def test_completions_reserve_the_output_cap_per_prompt_and_per_n(
    prompt: object, prompts: int
) -> None:
    needs = read_needs("completions", {"prompt": prompt, "max_tokens": 40, "n": 2})
    assert needs.choices == 2 * prompts
    assert needs.reserve(needs.prompt_bound, 40) == needs.prompt_bound + 40 * 2 * prompts


def test_the_context_must_hold_each_prompt_of_a_batch_not_their_sum() -> None:
    upstream = _upstream("completions", context=100)
    batch = read_needs("completions", {"prompt": [[1] * 60] * 3, "max_tokens": 30})
    assert batch.prompt_tokens == 180 and batch.longest() == (60, 60)
    assert missing_capability(upstream, batch) is None
    long = read_needs("completions", {"prompt": [[1] * 5, [1] * 80], "max_tokens": 30})
    assert missing_capability(upstream, long) == (
        "prompt (~80 tokens) + max_tokens (30) exceeds the model's context of 100 tokens"
    )


def test_embeddings_reserve_only_the_input() -> None:
    needs = read_needs("embeddings", {"input": ["abcd", "efgh"]})
    assert needs.output_cap(1000, None) == 0
    assert needs.reserve(needs.prompt_tokens, 0) == 2


@pytest.mark.parametrize(
    ("endpoint", "body", "param"),
    [
        ("chat/completions", {"messages": []}, "messages"),
        ("chat/completions", {"messages": ["hi"]}, "messages"),
        ("completions", {"prompt": 5}, "prompt"),
        ("chat/completions", {"messages": [{"content": "x"}], "max_tokens": -1}, "max_tokens"),
        ("chat/completions", {"messages": [{"content": "x"}], "n": 0}, "n"),
        ("chat/completions", {"messages": [{"content": "x"}], "n": 10**9}, "n"),
        ("chat/completions", {"messages": [{"content": "x"}], "max_tokens": 2**63}, "max_tokens"),
        ("completions", {"prompt": "x", "max_completion_tokens": True}, "max_completion_tokens"),
    ],
)
def test_malformed_bodies(endpoint: str, body: dict, param: str) -> None:
    with pytest.raises(BadRequest) as err:
        read_needs(endpoint, body)
    assert err.value.param == param


def test_refusals_name_the_reason() -> None:
    image = read_needs("chat/completions", {"messages": [{"content": [IMAGE]}]})
    assert missing_capability(_upstream("chat"), image) == "model does not support vision"
    assert missing_capability(_upstream("chat", "vision"), image) is None
    long = read_needs("chat/completions", {"messages": [{"content": "x" * 8000}], "max_tokens": 10})
    assert "exceeds the model's context of 1024" in str(
        missing_capability(_upstream("chat", context=1024), long)
    )
    big = read_needs("chat/completions", {"messages": [{"content": "x"}], "max_tokens": 600})
    assert "output limit 512" in str(missing_capability(_upstream("chat", output=512), big))
    assert missing_capability(_upstream("chat"), read_needs("embeddings", {"input": "x"})) == (
        "model does not support embeddings"
    )
