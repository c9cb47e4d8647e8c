"""Self-hosting against a hosted API, for one stretch of traffic: cost per million tokens,
per request and per successful task, what the hosted API would have charged, utilisation
of the planned capacity, and the volume at which the two cost the same."""

from __future__ import annotations

from dataclasses import dataclass

from inhouse.cost.settings import CostSettings


@dataclass(frozen=True, slots=True)
class Traffic:
    """Totals over `seconds` of serving."""

    seconds: float
    requests: int  # generating requests answered 200
    prompt_tokens: int
    completion_tokens: int
    successful_tasks: int

    @property
    def days(self) -> float:
        return self.seconds / 86400

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Comparison:
    """The figures `inhouse cost` prints (money in the `[cost]` currency)."""

    traffic: Traffic
    self_hosted: float  # what the hardware, power and people cost over the stretch
    hosted: float  # what the hosted API would have charged for the same tokens
    per_million_tokens: float | None
    per_request: float | None
    per_successful_task: float | None
    hosted_per_request: float | None
    hosted_per_successful_task: float | None
    utilisation: float | None  # tokens served / what the planned capacity could serve
    break_even_requests_per_day: float | None  # of this traffic's mix

    @property
    def requests_per_day(self) -> float:
        return self.traffic.requests / self.traffic.days if self.traffic.days else 0.0


def compare(traffic: Traffic, cost: CostSettings) -> Comparison:
    """The comparison for `traffic` under `cost`."""
    self_hosted = cost.per_day() * traffic.days
    hosted = cost.hosted.of(traffic.prompt_tokens, traffic.completion_tokens)
    hosted_per_request = _per(hosted, traffic.requests)
    capacity = cost.capacity_tokens_per_s
    return Comparison(
        traffic=traffic,
        self_hosted=self_hosted,
        hosted=hosted,
        per_million_tokens=_per(self_hosted, traffic.tokens / 1e6),
        per_request=_per(self_hosted, traffic.requests),
        per_successful_task=_per(self_hosted, traffic.successful_tasks),
        hosted_per_request=hosted_per_request,
        hosted_per_successful_task=_per(hosted, traffic.successful_tasks),
        utilisation=_per(traffic.tokens, capacity * traffic.seconds) if capacity else None,
        break_even_requests_per_day=_per(cost.per_day(), hosted_per_request or 0.0),
    )


def _per(amount: float, count: float) -> float | None:
    return amount / count if count > 0 else None


def report_lines(result: Comparison, currency: str, since: str) -> list[str]:
    """The report as text lines."""
    t = result.traffic

    def money(value: float | None, digits: int = 4) -> str:
        return "-" if value is None else f"{value:,.{digits}f} {currency}".strip()

    lines = [
        f"Traffic, last {since}: {t.requests:,} requests answered ({result.requests_per_day:,.0f}"
        f"/day), {t.prompt_tokens:,} input + {t.completion_tokens:,} output tokens,"
        f" {t.successful_tasks:,} successful tasks",
        f"Self-hosted cost:   {money(result.self_hosted, 2)}",
        f"  per million tokens  {money(result.per_million_tokens)}",
        f"  per request         {money(result.per_request, 6)}",
        f"  per successful task {money(result.per_successful_task, 6)}",
        f"Hosted API, same traffic: {money(result.hosted, 2)}",
        f"  per request         {money(result.hosted_per_request, 6)}",
        f"  per successful task {money(result.hosted_per_successful_task, 6)}",
    ]
    if result.utilisation is not None:
        lines.append(f"Utilisation of the planned capacity: {result.utilisation:.1%}")
    if result.break_even_requests_per_day is not None:
        cheaper = "self-hosting" if result.self_hosted < result.hosted else "the hosted API"
        lines.append(
            f"Break-even: {result.break_even_requests_per_day:,.0f} requests/day of this mix;"
            f" at this volume {cheaper} is cheaper"
        )
    return lines
