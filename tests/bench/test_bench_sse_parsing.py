import itertools
import json

from hypothesis import given
from hypothesis import strategies as st

from inhouse.bench.client import _StreamState
from inhouse.bench.requests import RequestRecord


def _stream(chat: bool) -> bytes:
    events = []
    for text in ["Hel", "lo", "", " wörld"]:
        choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
        events.append({"choices": [choice]})
    events.append(
        {
            "choices": [
                {
                    "index": 0,
                    "delta" if chat else "text": {} if chat else "",
                    "finish_reason": "length",
                }
            ]
        }
    )
    events.append({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4}})
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\r\n\r\n" for e in events)
    return b": keep-alive\n\n" + body + b"data: [DONE]\n\n"


def _feed(data: bytes, cuts: list[int]) -> tuple[RequestRecord, bool]:
    record = RequestRecord(index=0, start=0.0, status=200)
    state = _StreamState(record, sent_at=100.0)
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    for n, (a, b) in enumerate(itertools.pairwise(points)):
        state.feed(data[a:b], arrived_at=100.0 + n)
    return record, state.done


@given(st.lists(st.integers(0, 2000), max_size=30), st.booleans())
def test_any_split_of_the_byte_stream_gives_the_same_record(cuts: list[int], chat: bool) -> None:
    record, done = _feed(_stream(chat), cuts)
    assert done
    assert record.output_text == "Hello wörld"
    assert (record.prompt_tokens, record.output_tokens, record.token_source) == (7, 4, "usage")
    assert record.finish_reason == "length"
    assert len(record.chunk_times) == 3 and record.ttft == record.chunk_times[0]
    assert record.chunk_times == sorted(record.chunk_times)


def test_error_event_mid_stream_is_recorded() -> None:
    data = (
        b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: {"error":{"message":"boom"}}\n\n'
    )
    record, done = _feed(data, [])
    assert record.error == "stream: boom" and not record.ok and not done
