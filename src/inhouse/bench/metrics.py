"""Per-run metrics from request records: latency percentiles, throughput, goodput, failures."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from inhouse.bench.requests import RequestRecord

PERCENTILES = (50, 90, 95, 99)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0–100) with linear interpolation between ranks, as numpy's default."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError("q must lie in 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(slots=True, frozen=True)
class Distribution:
    """Mean and percentiles of one latency, in seconds; all None when nothing was measured."""

    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    max: float | None

    @classmethod
    def of(cls, values: Iterable[float]) -> Distribution:
        """The distribution of `values`."""
        data = list(values)
        if not data:
            return cls(0, None, None, None, None, None, None)
        p50, p90, p95, p99 = (percentile(data, q) for q in PERCENTILES)
        return cls(len(data), sum(data) / len(data), p50, p90, p95, p99, max(data))


@dataclass(slots=True, frozen=True)
class Slo:
    """Latency objectives in seconds; a request meets them when it succeeds within every one."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None

    @property
    def empty(self) -> bool:
        """True when no objective is set."""
        return self.ttft is None and self.tpot is None and self.e2e is None

    def met_by(self, record: RequestRecord) -> bool:
        """Whether `record` succeeded within every objective (a 1-token answer has no TPOT)."""
        if not record.ok:
            return False
        checks = ((self.ttft, record.ttft), (self.tpot, record.tpot), (self.e2e, record.e2e))
        return all(limit is None or value is None or value <= limit for limit, value in checks)


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*$")


def parse_seconds(text: str) -> float:
    """`500ms`, `0.5s` or a bare `500` (milliseconds, as vLLM's --goodput) → seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration like 500ms or 0.5s")
    value, unit = float(match.group(1)), match.group(2) or "ms"
    return value / 1000 if unit == "ms" else value


def parse_slo(text: str) -> Slo:
    """`ttft=500ms,tpot=50ms[,e2e=10s]` → Slo."""
    limits: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        name = name.strip().lower()
        if not sep or name not in ("ttft", "tpot", "e2e"):
            raise ValueError(f"{part!r}: expected ttft=…, tpot=… or e2e=…")
        limits[name] = parse_seconds(value)
    return Slo(**limits)


@dataclass(slots=True, frozen=True)
class RunSummary:
    """What one run measured; throughputs are per second of run duration."""

    completed: int
    failed: int
    failures: dict[str, int]
    duration: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    mean_input_tokens: float | None
    mean_intended_input_tokens: float | None
    goodput: float | None
    slo_met: int | None
    token_sources: dict[str, int]
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2e: Distribution

    def to_json(self) -> dict[str, Any]:
        """Plain data for the results file."""
        return asdict(self)


def _mean(values: list[int]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(records: Sequence[RequestRecord], duration: float, slo: Slo) -> RunSummary:
    """Aggregate `records` of a run that took `duration` seconds.

    Latencies come from successful requests only; ITL pools the chunk gaps of all of them.
    """
    done = [r for r in records if r.ok]
    failures = Counter(r.outcome for r in records if not r.ok)
    input_tokens = [r.prompt_tokens for r in done if r.prompt_tokens is not None]
    output_tokens = [r.output_tokens for r in done if r.output_tokens is not None]
    intended = [r.intended_input_tokens for r in done if r.intended_input_tokens is not None]
    per_second = 1 / duration if duration > 0 else 0.0
    met = None if slo.empty else sum(slo.met_by(r) for r in done)
    return RunSummary(
        completed=len(done),
        failed=len(records) - len(done),
        failures=dict(sorted(failures.items())),
        duration=duration,
        total_input_tokens=sum(input_tokens),
        total_output_tokens=sum(output_tokens),
        request_throughput=len(done) * per_second,
        output_throughput=sum(output_tokens) * per_second,
        total_token_throughput=(sum(input_tokens) + sum(output_tokens)) * per_second,
        mean_input_tokens=_mean(input_tokens),
        mean_intended_input_tokens=_mean(intended),
        goodput=None if met is None else met * per_second,
        slo_met=met,
        token_sources=dict(Counter(r.token_source or "none" for r in done)),
        ttft=Distribution.of(r.ttft for r in done if r.ttft is not None),
        tpot=Distribution.of(t for r in done if (t := r.tpot) is not None),
        itl=Distribution.of(gap for r in done for gap in r.itl),
        e2e=Distribution.of(r.e2e for r in done if r.e2e is not None),
    )
