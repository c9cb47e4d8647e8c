"""AsyncEngine: concurrent streams equal the synchronous engine, aborts free blocks at once,
bad input raises before scheduling, a request that fails in the step fails alone, a failing
step fails its requests but not the engine."""

from __future__ import annotations

import asyncio
import random

import pytest
from engine_helpers import TINY_BLOCK, TINY_BLOCK_BYTES, generate, greedy, tiny_engine

from inhouse.engine.async_engine import AsyncEngine, EngineDeadError
from inhouse.engine.config import EngineConfig
from inhouse.engine.errors import EngineInputError, RequestFailedError
from inhouse.engine.models.loader import load_model
from inhouse.engine.request import EngineRequest
from inhouse.engine.sampling_params import SamplingParams

NUM_BLOCKS = 128


@pytest.fixture(scope="module")
def tiny(tiny_llama_folder):
    return load_model(tiny_llama_folder, dtype="float32")


def make_async(loaded) -> AsyncEngine:
    config = EngineConfig(
        max_model_len=128,
        block_size=TINY_BLOCK,
        kv_cache_memory=NUM_BLOCKS * TINY_BLOCK_BYTES,
        max_num_batched_tokens=32,
        seed=0,
    )
    engine = AsyncEngine(config, loaded=loaded)
    engine.start()
    return engine


async def collect(engine: AsyncEngine, rid: str, prompt: list[int], params: SamplingParams):
    tokens, text, outputs = [], "", []
    async for out in engine.generate(EngineRequest(rid, prompt, params)):
        outputs.append(out)
        for delta in out.outputs:
            tokens += delta.token_ids
            text += delta.text
    return tokens, text, outputs


async def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def prompts(count: int) -> dict[str, list[int]]:
    rng = random.Random(11)
    return {
        f"a{i}": [rng.randrange(3, 384) for _ in range(rng.randint(2, 50))] for i in range(count)
    }


def test_concurrent_generate_streams_equal_the_sync_engine(tiny):
    batch = prompts(8)
    expected = generate(tiny_engine(tiny), batch, greedy(12))

    async def main():
        engine = make_async(tiny)
        try:
            results = await asyncio.gather(
                *(collect(engine, rid, p, greedy(12)) for rid, p in batch.items())
            )
            for (rid, _), (tokens, text, outputs) in zip(batch.items(), results, strict=True):
                assert tokens == expected[rid].choices[0].token_ids
                assert text == expected[rid].choices[0].text
                assert outputs[-1].finished and outputs[-1].timing is not None
                assert not any(o.finished for o in outputs[:-1])
            await wait_until(lambda: engine.stats().kv_cache_usage == 0)
            assert engine.stats().finished_requests == {"length": 8}
        finally:
            await engine.shutdown()

    asyncio.run(main())


def test_consumer_leaving_or_cancelling_aborts_and_frees_blocks(tiny):
    async def main():
        engine = make_async(tiny)
        pool = engine.core.kv_cache.pool
        long = SamplingParams(temperature=0, max_tokens=80, ignore_eos=True)
        try:
            stream = engine.generate(EngineRequest("leave", list(range(3, 40)), long))
            async for _ in stream:
                break
            await stream.aclose()
            task = asyncio.create_task(collect(engine, "cancel", list(range(5, 40)), long))
            await wait_until(lambda: engine.stats().generation_tokens > 3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await wait_until(lambda: engine.stats().finished_requests.get("abort") == 2)
            assert pool.num_free == pool.num_blocks
            assert all(b.ref_cnt == 0 for b in pool.blocks)
            tokens, _, _ = await collect(engine, "after", list(range(3, 9)), greedy(4))
            assert len(tokens) == 4
        finally:
            await engine.shutdown()

    asyncio.run(main())


def test_abort_by_id_ends_the_stream_with_finish_reason_abort(tiny):
    async def main():
        engine = make_async(tiny)
        try:
            params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
            task = asyncio.create_task(collect(engine, "x", list(range(3, 30)), params))
            await wait_until(lambda: engine.stats().num_running == 1)
            engine.abort("x")
            tokens, _, outputs = await task
            assert outputs[-1].finished
            assert outputs[-1].outputs[0].finish_reason == "abort"
            assert len(tokens) < 100
        finally:
            await engine.shutdown()

    asyncio.run(main())


def test_bad_input_raises_before_anything_is_scheduled(tiny):
    async def main():
        engine = make_async(tiny)
        try:
            with pytest.raises(EngineInputError, match="max_model_len is 128"):
                await anext(engine.generate(EngineRequest("big", list(range(3, 200)), greedy(1))))
            with pytest.raises(EngineInputError, match="empty"):
                await anext(engine.generate(EngineRequest("empty", [], greedy(1))))
            running = asyncio.create_task(collect(engine, "dup", list(range(3, 9)), greedy(30)))
            await wait_until(lambda: engine.stats().num_running == 1)
            with pytest.raises(EngineInputError, match="already running"):
                await anext(engine.generate(EngineRequest("dup", [5, 6], greedy(1))))
            tokens, _, _ = await running
            assert len(tokens) == 30
            assert engine.stats().prompt_tokens == 6
        finally:
            await engine.shutdown()

    asyncio.run(main())


def test_failed_step_fails_its_requests_and_the_engine_keeps_serving(tiny):
    async def main():
        engine = make_async(tiny)
        runner = engine.core.runner
        real_execute = runner.execute
        calls = {"n": 0}

        def failing_once(batch, *rest):
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("device lost")
            return real_execute(batch, *rest)

        runner.execute = failing_once
        try:
            with pytest.raises(EngineDeadError, match="device lost"):
                await collect(engine, "doomed", list(range(3, 20)), greedy(10))
            await wait_until(lambda: engine.stats().kv_cache_usage == 0)
            tokens, _, _ = await collect(engine, "next", list(range(3, 20)), greedy(10))
            assert len(tokens) == 10
        finally:
            await engine.shutdown()

    asyncio.run(main())


def test_shutdown_ends_running_streams(tiny):
    async def main():
        engine = make_async(tiny)
        params = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
        task = asyncio.create_task(collect(engine, "s", list(range(3, 8)), params))
        await wait_until(lambda: engine.stats().num_running == 1)
        await engine.shutdown()
        with pytest.raises(EngineDeadError, match="shut down"):
            await task
        assert engine.core.kv_cache.pool.num_free == NUM_BLOCKS

    asyncio.run(main())


def test_a_failing_guide_factory_fails_only_its_request(tiny):
    def broken_factory():
        raise ValueError("grammar exploded")

    async def main():
        engine = make_async(tiny)
        try:
            params = SamplingParams(temperature=0, max_tokens=5, guide_factory=broken_factory)
            with pytest.raises(ValueError, match="grammar exploded"):
                await collect(engine, "g", [5, 6, 7], params)
            tokens, _, _ = await collect(engine, "ok", [5, 6, 7], greedy(5))
            assert len(tokens) == 5
        finally:
            await engine.shutdown()

    asyncio.run(main())


class ExplodingGuide:
    """A grammar whose matcher breaks on the third token: a fault of one request only."""

    def __init__(self) -> None:
        self.seen = 0

    def mask_logits(self, logits_row: object) -> None:
        if self.seen == 2:
            raise RuntimeError("grammar matcher crashed")

    def accept(self, token_id: int) -> None:
        self.seen += 1

    def is_terminated(self) -> bool:
        return False


@pytest.mark.parametrize(
    "poison",
    [
        SamplingParams(temperature=0, max_tokens=12, guide_factory=ExplodingGuide),
        SamplingParams(temperature=0.7, max_tokens=12, seed=2**70),  # overflows torch's seed
    ],
    ids=["raising-guide", "overflowing-seed"],
)
def test_a_request_failing_in_the_step_fails_alone_and_every_other_completes(tiny, poison):
    batch = prompts(6)
    expected = generate(tiny_engine(tiny), batch, greedy(12))

    async def main():
        engine = make_async(tiny)
        try:
            others = [collect(engine, rid, p, greedy(12)) for rid, p in batch.items()]
            poisoned = collect(engine, "poison", list(range(3, 30)), poison)
            *results, failure = await asyncio.gather(*others, poisoned, return_exceptions=True)
            assert isinstance(failure, RequestFailedError)
            for (rid, _), result in zip(batch.items(), results, strict=True):
                tokens, _, outputs = result
                assert tokens == expected[rid].choices[0].token_ids
                assert outputs[-1].finished
            await wait_until(lambda: engine.stats().kv_cache_usage == 0)
            assert engine.stats().finished_requests == {"length": 6, "error": 1}
        finally:
            await engine.shutdown()

    asyncio.run(main())
