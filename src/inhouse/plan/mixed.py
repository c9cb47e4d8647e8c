"""Interactive latency under a stated batch load: two classes of clients on one simulated
engine (`inhouse.plan.simulate`), under each scheduling policy.

The batch class keeps ``in_flight`` requests in flight (a closed loop) for the whole run;
the interactive class's clients send ``requests`` chats one after another, starting once the
batch's first wave is decoding (or at ``start``), so the prediction is of a server in its
steady state rather than its start-up burst. A deterministic simulation of identical requests can
lock chats and batch prefills into one phase, so each point pools the chats of `PHASES`
runs started a fraction of a batch answer's time apart. Each policy's point sets the
interactive TTFT beside the same chats on an idle server, and the batch's output rate
beside what it gets alone over the same window.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from inhouse.plan.errors import PlanError
from inhouse.plan.perf_model import StepCost
from inhouse.plan.scheduling import check_policy
from inhouse.plan.sim_engine import SchedulerLimits
from inhouse.plan.simulate import Workload, quantile, simulate, simulate_workloads
from inhouse.scheduling.policy import POLICIES

MAX_CLIENTS = 4096
MAX_REQUESTS = 100_000
MAX_TOKENS = 1_000_000
MAX_START_S = 86_400.0
PRIORITY_RANGE = (-1000, 1000)  # the engine's bound on a request's priority
PHASES = 8
_TENANT = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


@dataclass(frozen=True, slots=True)
class InteractiveLoad:
    """Chats sent one after another by each of ``clients``; ``start_s`` None starts them
    once the batch's first wave is decoding."""

    clients: int = 1
    requests: int = 20
    prompt_tokens: int = 64
    output_tokens: int = 64
    priority: int = -1
    tenant: str = "interactive"
    start_s: float | None = None


@dataclass(frozen=True, slots=True)
class BatchLoad:
    """A batch job keeping ``in_flight`` requests in flight."""

    in_flight: int
    prompt_tokens: int = 1000
    output_tokens: int = 256
    priority: int = 1
    tenant: str = "batch"


_INTERACTIVE_KEYS = {
    "clients": ("clients", 1, MAX_CLIENTS),
    "requests": ("requests", 1, MAX_REQUESTS),
    "prompt-tokens": ("prompt_tokens", 1, MAX_TOKENS),
    "output-tokens": ("output_tokens", 1, MAX_TOKENS),
    "priority": ("priority", *PRIORITY_RANGE),
}
_BATCH_KEYS = {
    "in-flight": ("in_flight", 1, MAX_CLIENTS),
    "prompt-tokens": ("prompt_tokens", 1, MAX_TOKENS),
    "output-tokens": ("output_tokens", 1, MAX_TOKENS),
    "priority": ("priority", *PRIORITY_RANGE),
}


def _fields(option: str, text: str, ints: dict[str, tuple[str, int, int]]) -> dict[str, Any]:
    """`key=value, …` → keyword arguments; integers bounded, `tenant` and `start` checked."""
    known = [*ints, "tenant", *(["start"] if option == "--interactive" else [])]
    fields: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = (s.strip() for s in part.partition("="))
        if not eq or key not in known:
            raise PlanError(f"{option}: {part!r} is not one of {', '.join(known)}=…")
        if key == "tenant":
            if not _TENANT.match(value):
                raise PlanError(f"{option}: tenant={value!r} must be 1 to 64 letters, digits, .:_-")
            fields["tenant"] = value
        elif key == "start":
            try:
                start = float(value.removesuffix("s"))
            except ValueError:
                raise PlanError(f"{option}: start={value!r} is not a number of seconds") from None
            if not 0 <= start <= MAX_START_S:
                raise PlanError(f"{option}: start must lie in 0..{MAX_START_S:g} seconds")
            fields["start_s"] = start
        else:
            name, low, high = ints[key]
            try:
                number = int(value)
            except ValueError:
                raise PlanError(f"{option}: {key}={value!r} is not an integer") from None
            if not low <= number <= high:
                raise PlanError(f"{option}: {key} must lie in {low}..{high}, not {number}")
            fields[name] = number
    return fields


def parse_interactive(text: str) -> InteractiveLoad:
    """`clients=1, requests=20, prompt-tokens=40, output-tokens=64[, priority=-1,
    tenant=…, start=S]` → InteractiveLoad (every key optional)."""
    return InteractiveLoad(**_fields("--interactive", text, _INTERACTIVE_KEYS))


def parse_batch_load(text: str) -> BatchLoad:
    """`in-flight=16, prompt-tokens=1000, output-tokens=256[, priority=1, tenant=…]`."""
    fields = _fields("--batch-load", text, _BATCH_KEYS)
    if "in_flight" not in fields:
        raise PlanError("--batch-load needs in-flight=N, e.g. 'in-flight=16, prompt-tokens=1000'")
    return BatchLoad(**fields)


@dataclass(frozen=True, slots=True)
class MixedPoint:
    """One policy's prediction: interactive latencies (seconds), the batch's output rate."""

    policy: str
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    idle_ttft_p99: float
    batch_tokens_per_s: float
    batch_alone_tokens_per_s: float
    preemptions: int

    @property
    def ttft_p99_over_idle(self) -> float:
        return self.ttft_p99 / self.idle_ttft_p99 if self.idle_ttft_p99 > 0 else 0.0

    @property
    def batch_share(self) -> float:
        """The batch's output rate beside the interactive chats over what it gets alone."""
        alone = self.batch_alone_tokens_per_s
        return self.batch_tokens_per_s / alone if alone > 0 else 0.0


@dataclass(frozen=True, slots=True)
class MixedPlan:
    """The two classes, when the chats start, and one point per policy."""

    interactive: InteractiveLoad
    batch: BatchLoad
    start_s: float
    points: tuple[MixedPoint, ...]

    def point(self, policy: str) -> MixedPoint:
        """The point of one policy."""
        return next(p for p in self.points if p.policy == policy)

    def to_json(self) -> dict[str, Any]:
        """The section of `inhouse plan --json`."""
        return {
            "interactive": asdict(self.interactive),
            "batch": asdict(self.batch),
            "interactive_start_s": self.start_s,
            "policies": [
                {
                    **asdict(p),
                    "ttft_p99_over_idle": p.ttft_p99_over_idle,
                    "batch_share_of_alone": p.batch_share,
                }
                for p in self.points
            ],
        }


def _workloads(
    interactive: InteractiveLoad, batch: BatchLoad, start_s: float
) -> tuple[Workload, Workload]:
    chats = Workload(
        prompt_tokens=interactive.prompt_tokens,
        output_tokens=interactive.output_tokens,
        num_requests=interactive.requests,
        concurrency=interactive.clients,
        priority=interactive.priority,
        tenant=interactive.tenant,
        delay_s=start_s,
    )
    job = Workload(
        prompt_tokens=batch.prompt_tokens,
        output_tokens=batch.output_tokens,
        num_requests=None,
        concurrency=batch.in_flight,
        priority=batch.priority,
        tenant=batch.tenant,
    )
    return chats, job


def first_wave_decoding(cost: StepCost, limits: SchedulerLimits, batch: BatchLoad) -> float:
    """When the batch's first ``in_flight`` requests all have their first token."""
    wave = Workload(batch.prompt_tokens, 1, batch.in_flight, concurrency=batch.in_flight)
    return simulate(cost, wave, limits).duration


def batch_cycle(cost: StepCost, batch: BatchLoad) -> float:
    """Roughly how long one batch answer takes in the steady state (its decode steps): the
    period after which the batch's pattern of prefills repeats."""
    context = batch.prompt_tokens + batch.output_tokens // 2
    return cost.decode_step(batch.in_flight, context) * batch.output_tokens


def _point(
    cost: StepCost, limits: SchedulerLimits, chats: Workload, job: Workload, offsets: list[float]
) -> MixedPoint:
    """The chats' latencies pooled over runs whose chats start at each of `offsets` after
    `chats.delay_s`, so no single phase between chats and batch prefills decides the tail."""
    ttft: list[float] = []
    tpot: list[float] = []
    mixed_rate = alone_rate = 0.0
    preemptions = 0
    for offset in offsets:
        shifted = replace(chats, delay_s=chats.delay_s + offset)
        chat, batch = simulate_workloads(cost, [shifted, job], limits)
        end = shifted.delay_s + chat.duration
        alone = simulate_workloads(cost, [job], limits, until_s=end, since_s=shifted.delay_s)
        ttft += chat.ttft
        tpot += chat.tpot
        mixed_rate += batch.output_throughput / len(offsets)
        alone_rate += alone[0].output_throughput / len(offsets)
        preemptions += batch.preemptions
    idle = simulate(cost, replace(chats, delay_s=0.0), limits)
    return MixedPoint(
        policy=limits.policy,
        ttft_p50=quantile(ttft, 50),
        ttft_p99=quantile(ttft, 99),
        tpot_p50=quantile(tpot, 50) if tpot else 0.0,
        idle_ttft_p99=idle.ttft_p(99),
        batch_tokens_per_s=mixed_rate,
        batch_alone_tokens_per_s=alone_rate,
        preemptions=round(preemptions / len(offsets)),
    )


def plan_mixed(
    cost: StepCost,
    limits: SchedulerLimits,
    interactive: InteractiveLoad,
    batch: BatchLoad,
    policies: Iterable[str] = POLICIES,
    phases: int = PHASES,
) -> MixedPlan:
    """Predict interactive TTFT and the batch's rate under each policy (`limits` give the
    rest of the scheduler: seats, budget, KV, the long-prefill threshold), pooling `phases`
    runs whose chats start a fraction of a batch answer's time apart."""
    start = interactive.start_s
    if start is None:
        start = first_wave_decoding(cost, replace(limits, policy="fcfs"), batch)
    chats, job = _workloads(interactive, batch, start)
    step = batch_cycle(cost, batch) / phases
    offsets = [k * step for k in range(phases)]
    points = tuple(
        _point(cost, replace(limits, policy=check_policy(p)), chats, job, offsets) for p in policies
    )
    return MixedPlan(interactive, batch, start, points)
