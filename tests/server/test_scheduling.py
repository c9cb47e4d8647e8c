"""``inhouse serve --scheduling-policy priority``: a request's ``priority`` reaches the engine.

One seat (``--max-num-seqs 1``) held by a long low-priority stream: a batch request and then
an urgent one arrive; the urgent one takes the seat at once (the stream yields it, counted
as a priority preemption) and finishes first, and the stream still completes whole.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator

import httpx
import pytest
from conftest import API_KEY, RunningServer

from serving import start_serve

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def one_seat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    log = tmp_path_factory.mktemp("serve-priority") / "serve.log"
    served = start_serve(
        log, API_KEY, max_num_seqs="1", scheduling_policy="priority", embedding_model=None,
    )  # fmt: skip
    try:
        yield RunningServer(served)
    finally:
        served.stop()


def _preemptions(server: RunningServer) -> dict[str, float]:
    text = httpx.get(f"{server.base_url}/metrics").text
    lines = [line for line in text.splitlines() if line.startswith("inhouse:num_preemptions_by")]
    return {line.split('cause="')[1].split('"')[0]: float(line.split()[-1]) for line in lines}


def _counter(server: RunningServer, name: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics").text
    (line,) = [line for line in text.splitlines() if line.startswith(f"inhouse:{name}_total{{")]
    return float(line.split()[-1])


def test_an_urgent_request_overtakes_queued_batch_work_and_takes_the_seat(one_seat):
    before = _preemptions(one_seat)
    stopped_before = _counter(one_seat, "abandoned_steps")
    finished: list[str] = []

    async def run() -> int:
        client = one_seat.async_client()

        async def chat(name: str, priority: int, max_tokens: int) -> str:
            reply = await client.chat.completions.create(
                model=one_seat.served.model, messages=HI, max_tokens=max_tokens,
                temperature=0, extra_body={"priority": priority, "ignore_eos": True},
            )  # fmt: skip
            finished.append(name)
            return reply.choices[0].finish_reason

        stream = await client.chat.completions.create(
            model=one_seat.served.model, messages=HI, max_tokens=400, temperature=0,
            stream=True, stream_options={"include_usage": True},
            extra_body={"priority": 1, "ignore_eos": True},
        )  # fmt: skip
        deltas = tokens = 0
        batch = urgent = None
        async for chunk in stream:
            deltas += bool(chunk.choices and chunk.choices[0].delta.content)
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
            if deltas == 5 and batch is None:  # the stream holds the seat
                batch = asyncio.create_task(chat("batch", 1, 4))
                await asyncio.sleep(0.5)
                urgent = asyncio.create_task(chat("urgent", -1, 4))
        finished.append("stream")
        assert await batch == "length" and await urgent == "length"
        await client.close()
        return tokens

    started = time.monotonic()
    tokens = asyncio.run(run())
    assert finished == ["urgent", "stream", "batch"], finished
    assert tokens == 400, tokens  # the preempted stream went on to its end
    after = _preemptions(one_seat)
    assert after["priority"] - before.get("priority", 0) == 1 and after["kv"] == before["kv"]
    assert time.monotonic() - started < 300
    # The urgent request stops at most the one step it came in (if it came mid-step).
    stopped = _counter(one_seat, "abandoned_steps") - stopped_before
    assert stopped in (0, 1) and _counter(one_seat, "abandoned_tokens") >= stopped


def test_the_start_up_table_names_the_policy_and_its_caps(one_seat):
    table = one_seat.served.process.log.read_text()
    line = r"\n  scheduling +priority \(prefill cap 128 tokens a step, 4 background decodes\)\n"
    assert re.search(line, table), table[-600:]


def test_completions_take_a_priority_and_refuse_one_out_of_range(one_seat):
    with httpx.Client(
        base_url=one_seat.base_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60
    ) as http:
        body = {"model": one_seat.served.model, "prompt": "Hello", "max_tokens": 2}
        assert http.post("/v1/completions", json={**body, "priority": -1000}).status_code == 200
        refused = http.post("/v1/completions", json={**body, "priority": 10**6})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "priority"
