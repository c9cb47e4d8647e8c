"""What a speculative verify step costs against a plain decode step, and where it goes.

Part 1, the forward alone: one sequence holding the speculative workload's prompt
(``speculative.py``'s ~590-token report) plus some output, run through
``ModelRunner.execute`` with 1 row (a plain decode) and with 1 + K rows (its last token
and a K-token draft), alternately, median ms of ``--repeats`` each. ``--profile`` adds
torch's profiler table of the op calls for each row count (the C++ ``decode_layers`` is
one op; the LM head and the rest show apart).

Part 2, a real run: the speculative workload at c=1 through ``LLMEngine`` with
``--speculative-config`` and without, each request on one engine then the other (so
both see the same load on a shared host): output tok/s each way and their ratio, and
each step's wall time split into the drafter's proposal, scheduling, the forward, the
step's aftermath (``Scheduler.update``: sampling and verification) and the rest
(detokenizing, outputs), grouped by the step's rows.

    .venv/bin/python benchmarks/verify_step.py [--rows 1,5,9] [--repeats 40] [--profile]
        [--quantization auto|q8|q4|none] [--new-tokens 256] [--requests 4]
        [--speculative-config '{"method": "ngram", "num_speculative_tokens": 8, ...}']
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch

from engine_thread_profile import SECONDS, timed
from inhouse.engine.config import EngineConfig
from inhouse.engine.core import EngineCore
from inhouse.engine.engine import LLMEngine
from inhouse.engine.models.loader import LoadedModel, load_model
from inhouse.engine.request import EngineRequest
from inhouse.engine.runner import ModelRunner
from inhouse.engine.sampling_params import SamplingParams
from inhouse.engine.scheduler import Scheduler
from inhouse.engine.sequence import Sequence
from inhouse.engine.speculative.config import SpeculativeConfig
from inhouse.engine.speculative.drafter import Drafter
from speculative import DEFAULT_SPEC, prompts


def forward_ms(
    loaded: LoadedModel, rows: list[int], repeats: int, profile: bool
) -> dict[int, float]:
    """Median forward ms for each row count, run alternately on one cached sequence."""
    core = EngineCore(EngineConfig(quantization=loaded.quantization), loaded=loaded)
    prompt = prompts(loaded, 1)[0] + list(range(1000, 1040))  # a prompt and 40 "outputs"
    seq = Sequence("r", prompt, SamplingParams(max_tokens=64))
    assert core.kv_cache.allocate_slots(seq, len(prompt) + max(rows))
    core.runner.execute([(seq, len(prompt) - 1)])
    seq.num_computed_tokens = len(prompt) - 1
    draft = prompt[100 : 100 + max(rows) - 1]

    def once(n: int) -> float:
        drafts = {0: draft[: n - 1]} if n > 1 else None
        start = time.perf_counter()
        core.runner.execute([(seq, n)], drafts)
        return time.perf_counter() - start

    for n in rows:
        once(n)
    times: dict[int, list[float]] = defaultdict(list)
    for _ in range(repeats):
        for n in rows:
            times[n].append(once(n))
    if profile:
        for n in rows:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for _ in range(10):
                    once(n)
            print(f"\n--- {n} rows, 10 forwards ---")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    return {n: statistics.median(t) * 1e3 for n, t in times.items()}


@dataclass
class Tally:
    """One engine's run: tokens, seconds, and per-step parts (ms) by the step's rows."""

    tokens: int = 0
    seconds: float = 0.0
    rows_of: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))


def run_one(engine: LLMEngine, prompt: list[int], new_tokens: int, tally: Tally) -> None:
    """One request to its end; its tokens, time and step parts into ``tally``."""
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens)
    engine.add_request(EngineRequest(f"p{time.time()}", prompt, params))
    prefilled = False
    begin = time.perf_counter()
    while engine.has_unfinished():
        SECONDS.clear()
        start = time.perf_counter()
        for out in engine.step():
            tally.tokens += sum(len(c.token_ids) for c in out.outputs)
        total = time.perf_counter() - start
        if not prefilled:  # the prompt's step
            prefilled = True
            continue
        parts = tally.rows_of[LAST_ROWS[0]]
        parts["steps"] += 1
        parts["total"] += total * 1e3
        known = 0.0
        for label, seconds in SECONDS.items():
            parts[label] += seconds * 1e3
            known += seconds * 1e3
        parts["other"] += total * 1e3 - known
    tally.seconds += time.perf_counter() - begin


LAST_ROWS = [0]


def alternate(engines: list[LLMEngine], batch: list[list[int]], new_tokens: int) -> list[Tally]:
    """Each prompt on each engine in turn (so both see the same load), timed by parts."""
    undo = [
        timed(Drafter, "propose", "propose"),
        timed(Scheduler, "schedule", "schedule"),
        timed(ModelRunner, "execute", "forward"),
        timed(Scheduler, "update", "update"),
    ]
    schedule = Scheduler.schedule

    def counting(self: Scheduler, *args: Any, **kwargs: Any) -> Any:
        out = schedule(self, *args, **kwargs)
        LAST_ROWS[0] = out.num_tokens
        return out

    Scheduler.schedule = counting  # type: ignore[method-assign]
    tallies = [Tally() for _ in engines]
    try:
        for prompt in batch:
            for engine, tally in zip(engines, tallies, strict=True):
                run_one(engine, prompt, new_tokens, tally)
    finally:
        Scheduler.schedule = schedule  # type: ignore[method-assign]
        for u in reversed(undo):
            u()
    return tallies


def print_parts(title: str, rows_of: dict) -> None:
    labels = ["total", "propose", "schedule", "forward", "update", "other"]
    print(f"\n{title}: ms per step (mean), by the step's rows")
    print("  rows | steps | " + " | ".join(f"{x:>8}" for x in labels))
    for rows in sorted(rows_of):
        parts = rows_of[rows]
        n = parts["steps"]
        cells = " | ".join(f"{parts[x] / n:>8.2f}" for x in labels)
        print(f"{rows:>6} | {int(n):>5} | {cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,5,9")
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--quantization", default="auto")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--speculative-config", default=DEFAULT_SPEC)
    parser.add_argument("--skip-run", action="store_true", help="part 1 only")
    args = parser.parse_args()
    loaded = load_model(None, quantization=args.quantization)
    rows = [int(r) for r in args.rows.split(",")]
    medians = forward_ms(loaded, rows, args.repeats, args.profile)
    print(f"{loaded.quantization}, threads {torch.get_num_threads()}: forward alone (median ms)")
    for n in rows:
        print(f"  {n:>2} rows: {medians[n]:6.2f} ms  ({medians[n] / medians[rows[0]]:.2f}x)")
    if args.skip_run:
        return
    spec = SpeculativeConfig.parse(args.speculative_config)
    settings = {"quantization": args.quantization, "max_num_seqs": 1}
    engines = [
        LLMEngine(EngineConfig(**settings, speculative=speculative), loaded=loaded)
        for speculative in (None, spec)
    ]
    alternate(engines, prompts(loaded, 1), 8)  # warm-up
    plain, drafting = alternate(engines, prompts(loaded, args.requests), args.new_tokens)
    print(f"\nc=1, {args.requests} requests alternating, speculative: {spec.describe()}")
    print(
        f"plain {plain.tokens / plain.seconds:.1f} tok/s, speculative "
        f"{drafting.tokens / drafting.seconds:.1f} tok/s: "
        f"{drafting.tokens / drafting.seconds / (plain.tokens / plain.seconds):.2f}x"
    )
    print_parts("plain", plain.rows_of)
    print_parts("speculative", drafting.rows_of)


if __name__ == "__main__":
    main()
