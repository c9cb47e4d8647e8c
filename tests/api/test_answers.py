import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inhouse.api.answers import (
    ChoiceDelta,
    Chunk,
    EventSplitter,
    ToolCallFragment,
    UsageCounts,
    event_data,
    read_chunk,
)

DELTAS = [
    {"role": "assistant", "content": ""},
    {"reasoning_content": "think "},
    {"content": "Hé"},
    {"content": "llo"},
    {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": ""}}]},
    {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1}'}}]},
]


def _stream(line_end: bytes) -> bytes:
    events = [{"choices": [{"index": 0, "delta": d}]} for d in DELTAS]
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    events.append({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}})
    sep = line_end * 2
    body = b"".join(b"data: " + json.dumps(e).encode() + sep for e in events)
    return b": keep-alive" + sep + body + b"data: [DONE]" + sep


def _read(data: bytes, cuts: list[int]) -> tuple[list[Chunk], bytes]:
    splitter = EventSplitter()
    chunks = []
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    for a, b in itertools.pairwise(points):
        for event in splitter.feed(data[a:b]):
            payload = event_data(event)
            if payload is not None:
                chunks.append(read_chunk(payload))
    return chunks, splitter.rest


@given(st.lists(st.integers(0, 3000), max_size=40), st.sampled_from([b"\n", b"\r\n"]))
def test_any_chunk_boundaries_give_the_same_typed_deltas(cuts: list[int], end: bytes) -> None:
    chunks, rest = _read(_stream(end), cuts)
    assert rest == b""
    assert chunks == _read(_stream(b"\n"), [])[0]
    deltas = [c for chunk in chunks for c in chunk.choices]
    assert "".join(d.content for d in deltas) == "Héllo"
    assert "".join(d.reasoning for d in deltas) == "think "
    calls = [f for d in deltas for f in d.tool_calls]
    assert calls == [ToolCallFragment(0, "f", ""), ToolCallFragment(0, "", '{"a": 1}')]
    assert [d.produced for d in deltas] == [False, True, True, True, True, True, False]
    assert deltas[-1].finish_reason == "tool_calls"
    assert chunks[-2].usage == UsageCounts(7, 5) and chunks[-1].done


def test_an_event_of_several_data_lines_is_one_payload() -> None:
    (event,) = EventSplitter().feed(b'data: {"choices":\ndata: []}\n\n')
    assert read_chunk(event_data(event) or b"") == Chunk()
    assert event_data(b": comment") is None


def test_errors_and_odd_usage_are_typed() -> None:
    chunk = read_chunk(b'{"error": {"message": "boom", "type": "server_error"}}')
    assert (chunk.error_message, chunk.error_type) == ("boom", "server_error")
    usage = read_chunk(b'{"usage": {"prompt_tokens": true, "completion_tokens": -1}}').usage
    assert usage == UsageCounts(None, None)


def test_non_streamed_answers_read_like_deltas() -> None:
    message = {"content": None, "tool_calls": [{"function": {"name": "g", "arguments": "{}"}}]}
    answer = {"choices": [{"index": 1, "message": message, "finish_reason": "tool_calls"}]}
    (choice,) = read_chunk(json.dumps(answer).encode()).choices
    assert choice == ChoiceDelta(1, "", "", (ToolCallFragment(0, "g", "{}"),), "tool_calls")
    assert choice.text == "g{}"
    completion = read_chunk(b'{"choices": [{"text": "ab", "finish_reason": "stop"}]}')
    assert completion.choices == (ChoiceDelta(0, "ab", finish_reason="stop"),)


@pytest.mark.parametrize("payload", [b"not json", b"[1, 2]", b'"text"'])
def test_a_payload_that_is_not_a_json_object_is_refused(payload: bytes) -> None:
    with pytest.raises(ValueError):
        read_chunk(payload)
