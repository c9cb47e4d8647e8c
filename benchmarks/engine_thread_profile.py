"""Where the engine thread's time goes: forward pass, sampler, and everything else.

c chat requests run together through ``AsyncEngine`` (the server's engine), each
generating ``--new-tokens`` greedily with ignore_eos, consumed on the event loop as the
server does. The engine thread's busy time is the sum of its steps; the forward pass
(``ModelRunner.execute``) and the sampler (``Sampler.__call__``) are timed inside it; the
rest (scheduling, the step's aftermath, handing results over) is the overhead this
reports as a share. Timers wrap the classes for this process only.

    .venv/bin/python benchmarks/engine_thread_profile.py [--concurrency 16] [--new-tokens 128]
        [--quantization auto]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from inhouse.engine.async_engine import AsyncEngine
from inhouse.engine.config import EngineConfig
from inhouse.engine.models.loader import load_model
from inhouse.engine.request import EngineRequest
from inhouse.engine.runner import ModelRunner
from inhouse.engine.sampler import Sampler
from inhouse.engine.sampling_params import SamplingParams

QUESTION = "Explain in detail how a bicycle works, part by part (request {i})."
SECONDS: dict[str, float] = defaultdict(float)


def timed(owner: type, name: str, label: str) -> Callable[[], None]:
    """Wrap ``owner.name`` so its wall time adds up under ``label``; returns the undo."""
    inner: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            SECONDS[label] += time.perf_counter() - start

    setattr(owner, name, wrapper)
    return lambda: setattr(owner, name, inner)


async def drive(engine: AsyncEngine, prompts: list[list[int]], new_tokens: int) -> int:
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)

    async def one(i: int, prompt: list[int]) -> int:
        made = 0
        async for out in engine.generate(EngineRequest(f"p{time.time()}-{i}", prompt, params)):
            made += sum(len(c.token_ids) for c in out.outputs)
        return made

    return sum(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--quantization", default="auto", help="weights: auto, fp16, q8, ...")
    args = parser.parse_args()
    loaded = load_model(None, quantization=args.quantization)
    tok = loaded.tokenizer
    prompts = [
        tok.encode(
            tok.apply_chat_template(
                [{"role": "user", "content": QUESTION.format(i=i)}],
                add_generation_prompt=True,
                tokenize=False,
            ),
            add_special_tokens=False,
        )
        for i in range(args.concurrency)
    ]
    engine = AsyncEngine(EngineConfig(kv_cache_memory=512 * 2**20), loaded=loaded)
    timed(ModelRunner, "execute", "forward")
    timed(Sampler, "__call__", "sampler")
    timed(AsyncEngine, "_step", "step")

    async def run() -> tuple[int, float]:
        engine.start()
        try:
            await drive(engine, prompts[:2], 4)  # warm-up
            SECONDS.clear()
            start = time.perf_counter()
            made = await drive(engine, prompts, args.new_tokens)
            return made, time.perf_counter() - start
        finally:
            await engine.shutdown()

    made, wall = asyncio.run(run())
    step, forward, sampler = SECONDS["step"], SECONDS["forward"], SECONDS["sampler"]
    other = step - forward - sampler
    print(f"c={args.concurrency}, {made} tokens in {wall:.1f} s = {made / wall:.1f} tok/s")
    print(f"engine thread busy {step:.2f} s: forward {forward:.2f} s, sampler {sampler:.2f} s,")
    print(f"outside forward+sampler {other:.2f} s = {other / step:.1%} of the thread's busy time")


if __name__ == "__main__":
    main()
