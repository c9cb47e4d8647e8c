"""A long prompt's linears and TTFT with the q8/q4 linears on AMX tiles against the VNNI
loops, alternated in one process (``use_amx``), so a shared host's load hits both alike.

1. One layer of SmolLM2-135M's projections (q/k/v fused 960x576, o 576x576, gate/up fused
   3072x576, down 576x1536) at ``--rows`` activation rows, each kernel's fastest of
   ``--repeats`` on ``--threads`` threads (on one, by the thread's CPU time: preemption
   excluded; on more, by the wall clock, as the pool's helpers share the work).
2. The TTFT of ~``--rows``-token unique prompts on the bundled model (``LLMEngine``,
   ``max_tokens`` 1, the serve default's q4), wall and process CPU time, medians.

    .venv/bin/python benchmarks/amx_prefill.py [--rows 950] [--rounds 5] [--threads 2]
    taskset -c 1 .venv/bin/python benchmarks/amx_prefill.py --threads 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from inhouse.engine.config import EngineConfig
from inhouse.engine.engine import LLMEngine
from inhouse.engine.kernels.build import load_kernels
from inhouse.engine.kernels.quant import linear, quantize
from inhouse.engine.models.loader import load_model
from inhouse.engine.request import EngineRequest
from inhouse.engine.sampling_params import SamplingParams
from long_context import document

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in)
PATHS = {"amx": True, "vnni": False}


def linears(rows: int, repeats: int, clock) -> None:
    for kind in ("q4", "q8"):
        totals = dict.fromkeys(PATHS, 0.0)
        for out_features, in_features in SHAPES:
            weight = quantize(torch.randn(out_features, in_features) * 0.05, kind)
            x = torch.randn(rows, in_features)
            best = dict.fromkeys(PATHS, float("inf"))
            for _ in range(repeats):
                for name, on in PATHS.items():
                    torch.ops.inhouse_cpu.use_amx(on)
                    start = clock()
                    linear(x, weight, None)
                    best[name] = min(best[name], clock() - start)
            for name in PATHS:
                totals[name] += best[name]
            gops = 2 * rows * out_features * in_features / 1e9
            shown = "  ".join(
                f"{n} {best[n] * 1e3:6.2f} ms ({gops / best[n]:4.0f} GOP/s)" for n in PATHS
            )
            ratio = best["vnni"] / best["amx"]
            print(f"{kind} {out_features}x{in_features}: {shown}  vnni/amx {ratio:.2f}x")
        ratio = totals["vnni"] / totals["amx"]
        amx, vnni = totals["amx"] * 1e3, totals["vnni"] * 1e3
        print(f"{kind} layer: amx {amx:.2f} ms, vnni {vnni:.2f} ms, {ratio:.2f}x")


def ttft(rows: int, rounds: int) -> None:
    loaded = load_model(None, quantization="auto")
    engine = LLMEngine(EngineConfig(max_num_seqs=4), loaded=loaded)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)

    def one(seed: int) -> tuple[float, float]:
        ids = loaded.tokenizer(document(seed))["input_ids"][:rows]
        engine.add_request(EngineRequest(f"r{seed}", ids, params))
        wall, cpu = time.perf_counter(), time.process_time()
        while engine.has_unfinished():
            engine.step()
        return (time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3

    one(10_000)  # warm-up
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in PATHS}
    for r in range(rounds):
        for i, (name, on) in enumerate(PATHS.items()):
            torch.ops.inhouse_cpu.use_amx(on)
            figures[name].append(one(2 * r + i))
    for name, runs in figures.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"TTFT {rows} tokens, {name}: wall {wall:.0f} ms, CPU {cpu:.0f} ms (medians)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=950)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    kernels = load_kernels()
    if kernels is None or kernels.isa != "avx512-amx":
        raise SystemExit(f"no AMX tiles for the kernels here ({kernels and kernels.isa})")
    torch.set_num_threads(args.threads)
    torch.ops.inhouse_cpu.set_pool_threads(args.threads)
    print(f"{kernels.isa}, {args.threads} thread(s), load {os.getloadavg()}")
    linears(args.rows, args.repeats, time.thread_time if args.threads == 1 else time.perf_counter)
    ttft(args.rows, args.rounds)
    torch.ops.inhouse_cpu.use_amx(True)
    print(f"load at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
