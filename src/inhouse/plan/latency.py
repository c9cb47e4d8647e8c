"""The latency limit: TTFT and TPOT at each concurrency, and the knee where p99 TTFT passes the SLO.

Each concurrency is simulated (`inhouse.plan.simulate`) with the requests a sweep of
`inhouse bench sweep` sends at that step (``per_slot`` per slot, at least ``minimum``),
so prediction and measurement see the same start-up burst and the same tail.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from inhouse.plan.errors import PlanError
from inhouse.plan.perf_model import StepCost
from inhouse.plan.sim_engine import SchedulerLimits
from inhouse.plan.simulate import Workload, simulate

SEARCH_CEILING = 4096


@dataclass(frozen=True, slots=True)
class Traffic:
    """The workload to predict for: token lengths, and requests per concurrency step."""

    prompt_tokens: int = 256
    output_tokens: int = 128
    spread: float = 0.0
    per_slot: int = 4
    minimum: int = 8
    seed: int = 0

    def at(self, concurrency: int) -> Workload:
        """The closed-loop workload at one concurrency."""
        return Workload(
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            num_requests=max(self.minimum, concurrency * self.per_slot),
            concurrency=concurrency,
            spread=self.spread,
            seed=self.seed,
        )


@dataclass(frozen=True, slots=True)
class LatencyPoint:
    """Predicted latencies (seconds) and output throughput at one concurrency."""

    concurrency: int
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    tpot_p99: float
    output_tokens_per_s: float


@dataclass(frozen=True, slots=True)
class LatencyPlan:
    """The curve at the requested steps, the largest concurrency within the SLO, the knee."""

    slo_ttft: float
    points: tuple[LatencyPoint, ...]
    max_within_slo: int  # 0 when even one request alone misses the SLO
    knee: int | None  # the first of `points` over the SLO; None when none is

    def point(self, concurrency: int) -> LatencyPoint | None:
        """The curve's point at `concurrency`, if it was a step."""
        return next((p for p in self.points if p.concurrency == concurrency), None)


class Predictor:
    """Simulates concurrencies on demand and remembers each answer."""

    def __init__(self, cost: StepCost, limits: SchedulerLimits, traffic: Traffic) -> None:
        self.cost, self.limits, self.traffic = cost, limits, traffic
        self._seen: dict[int, LatencyPoint] = {}

    def at(self, concurrency: int) -> LatencyPoint:
        """The predicted point at one concurrency."""
        if concurrency not in self._seen:
            result = simulate(self.cost, self.traffic.at(concurrency), self.limits)
            self._seen[concurrency] = LatencyPoint(
                concurrency=concurrency,
                ttft_p50=result.ttft_p(50),
                ttft_p99=result.ttft_p(99),
                tpot_p50=result.tpot_p(50),
                tpot_p99=result.tpot_p(99),
                output_tokens_per_s=result.output_throughput,
            )
        return self._seen[concurrency]

    def within(self, concurrency: int, slo_ttft: float) -> bool:
        """Whether p99 TTFT at `concurrency` meets the SLO."""
        return self.at(concurrency).ttft_p99 <= slo_ttft

    def max_within_slo(self, slo_ttft: float) -> int:
        """The largest concurrency meeting the SLO: doubling until it fails, then bisecting."""
        if not self.within(1, slo_ttft):
            return 0
        good = 1
        while good * 2 <= SEARCH_CEILING and self.within(good * 2, slo_ttft):
            good *= 2
        bad = good * 2
        if bad > SEARCH_CEILING:
            return good
        while bad - good > 1:
            middle = (good + bad) // 2
            good, bad = (middle, bad) if self.within(middle, slo_ttft) else (good, middle)
        return good


def parse_steps(text: str) -> list[int]:
    """`1,2,4,8` → sorted distinct positive integers."""
    try:
        steps = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError as exc:
        raise PlanError(f"{text!r}: steps must be integers like 1,2,4,8") from exc
    if not steps or steps[0] < 1:
        raise PlanError(f"{text!r}: steps must be positive integers")
    return steps


def default_steps(max_within_slo: int) -> tuple[int, ...]:
    """1, 2, 4, … up to the first power of two ≥ max(16, 2 × the largest concurrency within)."""
    steps = [1]
    while steps[-1] < max(16, 2 * max_within_slo):
        steps.append(steps[-1] * 2)
    return tuple(steps)


def plan_latency(
    cost: StepCost,
    limits: SchedulerLimits,
    traffic: Traffic,
    slo_ttft: float,
    steps: Iterable[int] | None = None,
) -> LatencyPlan:
    """Predict the largest concurrency meeting ``p99 TTFT ≤ slo`` and the curve at `steps`
    (default: doubling to past twice that)."""
    predictor = Predictor(cost, limits, traffic)
    within = predictor.max_within_slo(slo_ttft)
    chosen = default_steps(within) if steps is None else steps
    points = tuple(predictor.at(c) for c in sorted(set(chosen)))
    knee = next((p.concurrency for p in points if p.ttft_p99 > slo_ttft), None)
    return LatencyPlan(slo_ttft, points, within, knee)
