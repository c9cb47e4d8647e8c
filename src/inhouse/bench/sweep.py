"""Concurrency sweep: doubling steps past the plan's prediction, and the knee where p99 TTFT
crosses the SLO — the real capacity — set beside what `plan` predicted."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from inhouse.bench.loadgen import LoadShape
from inhouse.bench.requests import BenchRequest
from inhouse.bench.run import RunContext, RunResult, execute_run
from inhouse.plan.latency import parse_steps

DEFAULT_TOP = 16
__all__ = ["concurrency_steps", "find_knee", "judge", "parse_steps", "run_sweep"]


def concurrency_steps(predicted: float | None = None, at_least: int | None = None) -> list[int]:
    """1, 2, 4, … up to the first power of two ≥ max(2 × predicted, at_least, 16 without either)."""
    targets = [t for t in (2 * predicted if predicted else None, at_least) if t]
    top = max(targets) if targets else DEFAULT_TOP
    steps = [1]
    while steps[-1] < top:
        steps.append(steps[-1] * 2)
    return steps


def find_knee(
    p99_ttft_by_concurrency: Sequence[tuple[int, float | None]], slo_ttft: float
) -> int | None:
    """The lowest concurrency whose p99 TTFT exceeds `slo_ttft` (no TTFT at all counts as over).

    None when every step stayed within the SLO.
    """
    for concurrency, p99 in sorted(p99_ttft_by_concurrency):
        if p99 is None or p99 > slo_ttft:
            return concurrency
    return None


@dataclass(slots=True, frozen=True)
class Verdict:
    """The knee beside the plan's prediction, and a sentence saying how far apart they are."""

    knee: int | None
    last_within_slo: int | None
    highest_tested: int
    predicted: float | None
    ratio: float | None
    sentence: str

    def to_json(self) -> dict[str, Any]:
        """Plain data for the results file."""
        return {
            "knee": self.knee,
            "last_within_slo": self.last_within_slo,
            "highest_tested": self.highest_tested,
            "predicted_max_concurrency": self.predicted,
            "knee_over_predicted": self.ratio,
            "sentence": self.sentence,
        }


def judge(steps: Sequence[int], knee: int | None, predicted: float | None) -> Verdict:
    """Compare the measured knee with the prediction."""
    ordered = sorted(steps)
    below = [s for s in ordered if knee is None or s < knee]
    last_ok = below[-1] if below else None
    top = ordered[-1]
    if knee is None:
        measured = f"p99 TTFT stayed within the SLO up to {top}, the highest concurrency tested"
    else:
        measured = f"the knee is at concurrency {knee}: p99 TTFT first exceeds the SLO there"
        measured += f" ({last_ok} was the last step within it)" if last_ok else " (already at 1)"
    if predicted is None:
        return Verdict(knee, last_ok, top, None, None, measured + "; no plan to compare with.")
    if knee is None:
        ratio = None
        gap = f"plan predicted {predicted:g}; real capacity is at least {top / predicted:.2f}× that"
    else:
        ratio = knee / predicted
        side = "below" if knee < predicted else "at or above"
        gap = f"plan predicted {predicted:g}; the knee is {ratio:.2f}× the prediction ({side})"
    return Verdict(knee, last_ok, top, predicted, ratio, f"{measured}; {gap}.")


def prompts_for_step(concurrency: int, per_slot: int, minimum: int) -> int:
    """Requests at one step: `per_slot` for every concurrent slot, never fewer than `minimum`."""
    return max(minimum, math.ceil(concurrency * per_slot))


@dataclass(slots=True)
class SweepResult:
    """Every step's run and the verdict."""

    runs: list[RunResult]
    verdict: Verdict


def step_sizes(steps: Sequence[int], per_slot: int, minimum: int) -> list[int]:
    """How many requests each step sends, in step order."""
    return [prompts_for_step(c, per_slot, minimum) for c in sorted(steps)]


async def run_sweep(
    context: RunContext,
    steps: Sequence[int],
    step_requests: Sequence[Sequence[BenchRequest]],
    *,
    slo_ttft: float,
    predicted: float | None,
    base_shape: LoadShape,
    warmup: Sequence[BenchRequest] = (),
) -> SweepResult:
    """One closed-loop run per step over that step's own prompts (so no step finds another's
    prompts in the prefix cache); warm-up before the first step only; then the knee."""
    runs = []
    for position, (concurrency, requests) in enumerate(
        zip(sorted(steps), step_requests, strict=True)
    ):
        shape = replace(
            base_shape, max_concurrency=concurrency, request_rate=None, num_prompts=len(requests)
        )
        runs.append(
            await execute_run(
                context,
                requests,
                shape,
                warmup=warmup if position == 0 else (),
                label=f"concurrency {concurrency}",
            )
        )
    p99s = [(run.shape.max_concurrency or 0, run.summary.ttft.p99) for run in runs]
    knee = find_knee(p99s, slo_ttft)
    return SweepResult(runs, judge(steps, knee, predicted))
