"""Long-context engine timings, A/B between source trees in one run: TPOT (median decode
step) at a short context and at ~2.5k tokens of context, c=1 and c=4, and the TTFT of one
~2.5k-token prompt alone (the c=1 run's prefill steps, nothing else running).

Each tree is measured in its own child process (``PYTHONPATH=<tree>/src``), the trees
alternating round by round, so a noisy shared host slows both alike; it prints each
round's figures and, per figure, the median over rounds and the ratio of the last tree to
the first. The prompts are unique documents (no prefix shared between them).

    .venv/bin/python benchmarks/long_context.py --trees /work/main /work/wt/mine --rounds 3
    .venv/bin/python benchmarks/long_context.py --concurrency 1   # this tree, one round
    .venv/bin/python benchmarks/long_context.py --kv-cache-dtypes auto,int8 --rounds 2

With several ``--kv-cache-dtypes`` every tree runs with each, alternating the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

LONG_TOKENS = 2500
DECODE_STEPS = 32
WORDS = [
    *("report", "budget", "river", "station", "council", "market", "engine", "winter"),
    *("garden", "letter", "policy", "history", "signal", "harbor", "answer", "window"),
    *("energy", "doctor", "bridge", "silver", "number", "travel", "system", "morning"),
]


def document(seed: int, words: int = 2400) -> str:
    """A unique pseudo-document: seeded words in sentences of ten."""
    rng = random.Random(seed)
    picks = [rng.choice(WORDS) for _ in range(words)]
    return " ".join(" ".join(picks[i : i + 10]) + "." for i in range(0, words, 10))


def measure(concurrency: list[int], quantization: str, kv_cache_dtype: str) -> dict[str, float]:
    """This process's tree: the figures in ms."""
    import time

    from engine_throughput import chat_prompts
    from inhouse.engine.config import EngineConfig
    from inhouse.engine.engine import LLMEngine
    from inhouse.engine.models.loader import load_model
    from inhouse.engine.request import EngineRequest
    from inhouse.engine.sampling_params import SamplingParams

    loaded = load_model(None, quantization=quantization)
    config = EngineConfig(max_num_seqs=4, kv_cache_dtype=kv_cache_dtype)

    def steps(prompts: list[list[int]], new_tokens: int) -> list[float]:
        engine = LLMEngine(config, loaded=loaded)
        params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
        for i, ids in enumerate(prompts):
            engine.add_request(EngineRequest(f"r{i}", ids, params))
        times = []
        while engine.has_unfinished():
            start = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - start)
        return times

    def long_prompts(count: int) -> list[list[int]]:
        ids = [loaded.tokenizer(document(seed))["input_ids"] for seed in range(count)]
        assert all(len(p) >= LONG_TOKENS for p in ids), "documents shorter than asked"
        return [p[:LONG_TOKENS] for p in ids]

    def prefill_and_tpot(prompts: list[list[int]]) -> tuple[float, float]:
        """The steps before the first decode step, and the median decode step, in ms."""
        times = steps(prompts, DECODE_STEPS)
        prefill_steps = len(times) - (DECODE_STEPS - 1)
        decode = times[prefill_steps:]
        return sum(times[:prefill_steps]) * 1e3, statistics.median(decode) * 1e3

    figures = {}
    steps(chat_prompts(loaded, 1), 4)  # warm-up
    for c in concurrency:
        figures[f"tpot_short_c{c}"] = prefill_and_tpot(chat_prompts(loaded, c))[1]
        prefill, figures[f"tpot_long_c{c}"] = prefill_and_tpot(long_prompts(c))
        if c == 1:
            figures["ttft_long"] = prefill
    return figures


def child(tree: Path, concurrency: str, quantization: str, kv: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=f"{tree / 'src'}{os.pathsep}{Path(__file__).parent}")
    command = [sys.executable, __file__, "--child", "--concurrency", concurrency]
    command += ["--quantization", quantization]
    if kv != "auto":  # a tree from before the option runs its default
        command += ["--kv-cache-dtypes", kv]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", nargs="+", type=Path, default=[Path(__file__).parents[1]])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--concurrency", default="1,4", help="sequences at once, e.g. 1,4")
    parser.add_argument(
        "--quantization", default="auto", help="as inhouse serve's (auto: what serve runs)"
    )
    parser.add_argument(
        "--kv-cache-dtypes",
        default="auto",
        help="as inhouse serve's --kv-cache-dtype, e.g. auto,int8",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    concurrency = [int(c) for c in args.concurrency.split(",")]
    if args.child:
        print(json.dumps(measure(concurrency, args.quantization, args.kv_cache_dtypes)))
        return
    variants = [(tree, kv) for tree in args.trees for kv in args.kv_cache_dtypes.split(",")]
    results: dict[tuple[Path, str], list[dict[str, float]]] = {v: [] for v in variants}
    for r in range(args.rounds):
        for tree, kv in variants:
            figures = child(tree, args.concurrency, args.quantization, kv)
            results[tree, kv].append(figures)
            load = os.getloadavg()[0]
            shown = " ".join(f"{k} {v:.1f}" for k, v in figures.items())
            print(f"round {r + 1} {tree} kv {kv} (load {load:.1f}): {shown}", flush=True)
    medians = {
        f"{tree} kv {kv}": {k: statistics.median(f[k] for f in runs) for k in runs[0]}
        for (tree, kv), runs in results.items()
    }
    for tree, figures in medians.items():
        long_vs_short = " ".join(
            f"c={c} long/short {figures[f'tpot_long_c{c}'] / figures[f'tpot_short_c{c}']:.2f}x"
            for c in concurrency
        )
        print(f"median {tree}: " + " ".join(f"{k} {v:.1f} ms" for k, v in figures.items()))
        print(f"  {long_vs_short}")
    if len(medians) > 1:
        (first_name, first), *_, (last_name, last) = medians.items()
        ratios = " ".join(f"{k} {last[k] / first[k]:.2f}x" for k in first)
        print(f"{last_name} / {first_name}: {ratios}")


if __name__ == "__main__":
    main()
