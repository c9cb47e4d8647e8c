"""Incremental detokenizing and stop strings, through the bundled model's real tokenizer."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inhouse.engine.detokenizer import IncrementalDetokenizer, pending_stop_prefix

MIXED = "Grüße 👋🏽 from 東京! ok 🎉🎉 done — naïve café ☕."


@pytest.fixture(scope="module")
def tokenizer(bundled_model_fp32) -> Any:
    return bundled_model_fp32.tokenizer


def stream(
    tokenizer: Any, text: str, prompt: str = "Say:", **kwargs: Any
) -> tuple[list[str], IncrementalDetokenizer]:
    """Feed the tokens of ``text`` one at a time; collect every delta handed out."""
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode(prompt), **kwargs)
    deltas = []
    for token_id in tokenizer.encode(text):
        detok.add_token(token_id)
        finished = detok.stop_string is not None
        deltas.append(detok.take_delta(finished))
        if finished:
            return deltas, detok
    deltas.append(detok.take_delta(finished=True))
    return deltas, detok


def test_multibyte_characters_stream_whole(tokenizer: Any) -> None:
    ids = tokenizer.encode(MIXED)
    assert len(ids) > len(MIXED.split())  # some characters span several tokens
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)
    deltas, _ = stream(tokenizer, MIXED)
    assert "".join(deltas) == MIXED
    assert not any("\ufffd" in d for d in deltas)


def test_leading_spaces_survive_between_deltas(tokenizer: Any) -> None:
    text = " The quick brown fox jumps over the lazy dog."
    deltas, _ = stream(tokenizer, text)
    assert "".join(deltas) == text


def test_stop_string_split_across_tokens_never_leaks(tokenizer: Any) -> None:
    text = "Answer: forty-two. END_OF_ANSWER and more text"
    stop = "END_OF_ANSWER"
    assert not any(stop in tokenizer.decode([i]) for i in tokenizer.encode(text))
    deltas, detok = stream(tokenizer, text, stop=[stop])
    assert detok.stop_string == stop
    expected = "Answer: forty-two. "
    assert "".join(deltas) == expected
    for i in range(len(deltas)):
        assert expected.startswith("".join(deltas[: i + 1]))  # nothing later taken back


def test_held_back_text_is_released_when_it_is_not_a_stop(tokenizer: Any) -> None:
    text = "Call the END function, then ENDURE."
    deltas, detok = stream(tokenizer, text, stop=["END_OF"])
    assert detok.stop_string is None
    assert "".join(deltas) == text


def test_include_stop_str_in_output_and_earliest_stop_wins(tokenizer: Any) -> None:
    text = "alpha beta gamma delta"
    deltas, detok = stream(tokenizer, text, stop=["delta", "beta"], include_stop_str_in_output=True)
    assert detok.stop_string == "beta"
    assert "".join(deltas) == "alpha beta"


def test_stop_string_inside_multibyte_text(tokenizer: Any) -> None:
    deltas, detok = stream(tokenizer, "東京 is big 🎉 and 京都 too", stop=["🎉"])
    assert detok.stop_string == "🎉"
    assert "".join(deltas) == "東京 is big "


def test_special_tokens_skipped_or_kept(tokenizer: Any) -> None:
    eos = tokenizer.eos_token_id
    for skip, expected in [(True, "Hi"), (False, "Hi" + tokenizer.eos_token)]:
        detok = IncrementalDetokenizer(tokenizer, [1, 2], skip_special_tokens=skip)
        for token_id in [*tokenizer.encode("Hi"), eos]:
            detok.add_token(token_id)
        assert detok.take_delta(finished=True) == expected


@settings(max_examples=500, deadline=None)
@given(
    text=st.text(alphabet="ab\n", max_size=12),
    stops=st.lists(st.text(alphabet="ab\n", min_size=1, max_size=6), max_size=4),
)
def test_the_held_back_tail_is_the_longest_one_that_begins_a_stop(
    text: str, stops: list[str]
) -> None:
    def begins_a_stop(size: int) -> bool:
        return any(size < len(s) and s.startswith(text[len(text) - size :]) for s in stops)

    expected = max(size for size in range(len(text) + 1) if size == 0 or begins_a_stop(size))
    assert pending_stop_prefix(text, stops) == expected
