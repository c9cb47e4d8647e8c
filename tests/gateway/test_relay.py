import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator

from hypothesis import given
from hypothesis import strategies as st

from inhouse.gateway.call import Outcome
from inhouse.gateway.exchange import read_answer, relay_events

EVENTS = [
    b": keep-alive",
    b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
    b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}',
    b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}',
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}',
    b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2}}',
    b"data: [DONE]",
]
USAGE_EVENT = 5


async def _pieces(data: bytes, cuts: list[int], fail: bool = False) -> AsyncIterator[bytes]:
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    for a, b in itertools.pairwise(points):
        yield data[a:b]
    if fail:
        raise ConnectionResetError


def _relay(data: bytes, cuts: list[int], strip: bool, fail: bool = False) -> tuple[bytes, Outcome]:
    outcome = Outcome(text=[])
    clock = itertools.count(1.0).__next__

    async def run() -> bytes:
        chunks = relay_events(_pieces(data, cuts, fail), outcome, strip, clock=clock)
        return b"".join([c async for c in chunks])

    return asyncio.run(run()), outcome


@given(st.lists(st.integers(0, 500), max_size=25), st.booleans(), st.booleans())
def test_relay_passes_every_event_but_a_stripped_usage_chunk(
    cuts: list[int], strip: bool, crlf: bool
) -> None:
    end = b"\r\n\r\n" if crlf else b"\n\n"
    out, outcome = _relay(end.join(EVENTS) + end, cuts, strip)
    kept = [e for i, e in enumerate(EVENTS) if not (strip and i == USAGE_EVENT)]
    assert out == b"\n\n".join(kept) + b"\n\n"
    assert (outcome.prompt_tokens, outcome.completion_tokens) == (9, 2)
    assert (outcome.finish_reason, outcome.completed, outcome.content_chunks) == ("stop", True, 2)
    assert outcome.text == ["", "Hi"] and outcome.first_token_at == 1.0


def test_a_broken_upstream_ends_the_stream_with_an_openai_error_event() -> None:
    out, outcome = _relay(EVENTS[3] + b"\n\n", [], strip=True, fail=True)
    first, error = out.split(b"\n\n")[:2]
    assert first == EVENTS[3]
    body = json.loads(error.removeprefix(b"data: "))
    assert body["error"]["code"] == "upstream_error" and body["error"]["param"] is None
    assert (outcome.status, outcome.error_type, outcome.completed) == (502, "upstream_error", True)


def test_a_client_that_leaves_once_done_is_sent_had_the_whole_answer() -> None:
    """The client closes on reading [DONE] while the upstream's body has not ended yet."""
    outcome = Outcome()

    async def upstream() -> AsyncIterator[bytes]:
        yield EVENTS[3] + b"\n\n"
        yield EVENTS[-1] + b"\n\n"
        await asyncio.Event().wait()  # the body's end never comes before the client leaves
        yield b""

    async def client_reads_until_done() -> None:
        chunks = relay_events(upstream(), outcome, strip_usage=True)
        got = [await anext(chunks), await anext(chunks)]
        assert got[-1] == EVENTS[-1] + b"\n\n" and not outcome.completed
        reading = asyncio.ensure_future(anext(chunks))  # the next read: the [DONE] was sent
        await asyncio.sleep(0.01)
        reading.cancel()  # the client left
        with contextlib.suppress(asyncio.CancelledError):
            await reading

    asyncio.run(client_reads_until_done())
    assert outcome.completed


def test_an_unterminated_tail_is_passed_on_as_it_came() -> None:
    out, _ = _relay(EVENTS[3] + b"\n\ndata: {partial", [7], strip=False)
    assert out == EVENTS[3] + b"\n\ndata: {partial"


def test_read_answer_takes_usage_finish_reason_and_text() -> None:
    outcome = Outcome()
    answer = {
        "choices": [{"index": 0, "message": {"content": "Hi"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 4, "completion_tokens": 1},
    }
    read_answer(json.dumps(answer).encode(), outcome, keep_text=True)
    assert (outcome.prompt_tokens, outcome.completion_tokens) == (4, 1)
    assert (outcome.finish_reason, outcome.text) == ("length", ["Hi"])
    read_answer(b'{"error": {"message": "x", "type": "server_error"}}', outcome, keep_text=False)
    assert outcome.error_type == "server_error"
