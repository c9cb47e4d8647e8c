"""TTFT of a long prompt with its rows attended on bf16 products (AMX tiles, or AVX-512
BF16's vdpbf16ps where the CPU has no AMX) against the float32 loops, alternated in one
engine (``ModelRunner.prompt_tiles``), so a drifting host slows both alike.

The bundled model at the serve default (q4), ``LLMEngine`` alone (no HTTP), unique prompts
of ``--lens`` tokens cut from ``long_context.document``, ``max_tokens`` 1; prints each
path's median wall time over ``--rounds``.

    .venv/bin/python benchmarks/prompt_attention.py [--lens 950,2500] [--rounds 5]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time

from inhouse.engine.config import EngineConfig
from inhouse.engine.engine import LLMEngine
from inhouse.engine.models.loader import load_model
from inhouse.engine.request import EngineRequest
from inhouse.engine.sampling_params import SamplingParams
from long_context import document


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lens", default="950,2500", help="prompt tokens")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    loaded = load_model(None, quantization="auto")
    engine = LLMEngine(EngineConfig(max_num_seqs=4, max_model_len=4096), loaded=loaded)
    runner = engine.core.runner
    if not runner.prompt_tiles:
        raise SystemExit("no bf16 products for a prompt's attention here (AVX-512 BF16 or AMX)")
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    seeds = itertools.count()

    def ttft_ms(tokens: int) -> float:
        seed = next(seeds)
        text = document(seed) + document(seed + 50_000)  # one document may be too short
        ids = loaded.tokenizer(text)["input_ids"][:tokens]
        engine.add_request(EngineRequest(f"r{seed}", ids, params))
        start = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        return (time.perf_counter() - start) * 1e3

    print(f"{loaded.quantization}, load {os.getloadavg()}")
    for tokens in map(int, args.lens.split(",")):
        ttft_ms(tokens)  # warm-up
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.rounds):
            for products in (True, False):
                runner.prompt_tiles = products
                times[products].append(ttft_ms(tokens))
        runner.prompt_tiles = True
        bf16, loops = (statistics.median(times[p]) for p in (True, False))
        print(
            f"{tokens} tokens: bf16 products {bf16:.0f} ms, float32 loops {loops:.0f} ms, "
            f"{loops / bf16:.2f}x (medians of {args.rounds})"
        )
    print(f"load at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
