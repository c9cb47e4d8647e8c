"""A discrete-event simulation of continuous batching: workloads of clients sending requests
to one simulated engine replica (`inhouse.plan.sim_engine`), step by step.

Clients are closed-loop (``concurrency`` in flight, the next sent when one finishes) or
open-loop (Poisson arrivals at ``rate``). Several workloads can share the engine, each with
its own priority and tenant: a *counted* workload sends ``num_requests``; a *background* one
(``num_requests`` None) keeps its requests in flight until every counted one is done, which
is how a batch job sits under interactive traffic. Queueing is what a closed formula leaves
out, and what sets TTFT near the knee.
"""

from __future__ import annotations

import heapq
import random
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from inhouse.plan.errors import PlanError
from inhouse.plan.perf_model import StepCost
from inhouse.plan.sim_engine import SchedulerLimits, SimEngine
from inhouse.plan.sim_request import SimRequest


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests as the benchmark sends them: token lengths uniform in mean·(1 ± spread).

    ``num_requests`` None makes the workload background (closed loop only); ``delay_s`` is
    when its clients start; ``priority`` (lower first) and ``tenant`` tag its requests.
    """

    prompt_tokens: int
    output_tokens: int
    num_requests: int | None
    concurrency: int | None = None  # closed loop
    rate: float | None = None  # open loop, requests per second (Poisson)
    spread: float = 0.0
    seed: int = 0
    priority: int = 0
    tenant: str = ""
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise PlanError("a workload needs exactly one of concurrency (closed) or rate (open)")
        if min(self.prompt_tokens, self.output_tokens, self.num_requests or 1) < 1:
            raise PlanError("prompt tokens, output tokens and requests must be at least 1")
        if self.concurrency is not None and self.concurrency < 1:
            raise PlanError(f"concurrency must be at least 1, not {self.concurrency}")
        if self.rate is not None and not self.rate > 0:
            raise PlanError(f"the request rate must be positive, not {self.rate}")
        if self.num_requests is None and self.rate is not None:
            raise PlanError("a background workload (no request count) needs a concurrency")
        if not 0 <= self.spread < 1:
            raise PlanError(f"the length spread must lie in [0, 1), not {self.spread}")
        if not 0 <= self.delay_s < float("inf"):
            raise PlanError(f"a workload's start delay must be ≥ 0 seconds, not {self.delay_s}")

    @property
    def background(self) -> bool:
        return self.num_requests is None


@dataclass(frozen=True, slots=True)
class SimResult:
    """Per-request latencies (seconds) and the run's totals, for one workload.

    A background workload's TTFT counts every request that got its first token, and its
    output tokens and duration cover the window in which the counted workloads ran.
    """

    ttft: list[float]
    tpot: list[float]
    e2e: list[float]
    duration: float
    output_tokens: int
    steps: int
    peak_running: int
    preemptions: int = 0

    def ttft_p(self, q: int) -> float:
        """The q-th percentile (0–100) of TTFT, linear between ranks as numpy and `bench`;
        0 when no request got a first token."""
        return quantile(self.ttft, q) if self.ttft else 0.0

    def tpot_p(self, q: int) -> float:
        """The q-th percentile of TPOT; 0 when no request produced two tokens."""
        return quantile(self.tpot, q) if self.tpot else 0.0

    @property
    def output_throughput(self) -> float:
        """Output tokens per second over the run."""
        return self.output_tokens / self.duration if self.duration > 0 else 0.0


def quantile(values: list[float], q: int) -> float:
    """The q-th percentile (an integer 1..99), linear between ranks as numpy's default."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _lengths(workload: Workload) -> Iterator[tuple[int, int]]:
    """(prompt, output) of each request in turn, drawn as the benchmark draws them."""
    rng = random.Random(workload.seed)

    def draw(mean: int) -> int:
        low, high = round(mean * (1 - workload.spread)), round(mean * (1 + workload.spread))
        return max(1, rng.randint(low, high))

    while True:
        prompt = draw(workload.prompt_tokens)
        yield prompt, draw(workload.output_tokens)


class _Clients:
    """Every workload's clients: when each sends, and what each has had answered."""

    def __init__(self, cost: StepCost, workloads: Sequence[Workload]) -> None:
        self.cost, self.workloads = cost, workloads
        self.lengths = [_lengths(w) for w in workloads]
        self.arrivals: list[tuple[float, int, int, SimRequest]] = []
        self.issued = [0] * len(workloads)
        self.done: list[list[SimRequest]] = [[] for _ in workloads]
        self.sent: list[list[SimRequest]] = [[] for _ in workloads]
        self.counted = [k for k, w in enumerate(workloads) if not w.background]
        for k, w in enumerate(workloads):
            if w.concurrency is not None:
                for _ in range(min(w.concurrency, w.num_requests or w.concurrency)):
                    self.send(k, w.delay_s)
            else:
                assert w.rate is not None and w.num_requests is not None
                rng, at = random.Random(w.seed + 1), w.delay_s
                for _ in range(w.num_requests):
                    self.send(k, at)
                    at += rng.expovariate(w.rate)

    def send(self, k: int, at: float) -> None:
        prompt, output = next(self.lengths[k])
        w = self.workloads[k]
        request = SimRequest(prompt, output, at, klass=k, priority=w.priority, tenant=w.tenant)
        self.sent[k].append(request)
        heapq.heappush(self.arrivals, (at + self.cost.request_s, k, self.issued[k], request))
        self.issued[k] += 1

    @property
    def counted_done(self) -> bool:
        """Whether every counted workload is answered (never, when there is none)."""
        return bool(self.counted) and all(
            len(self.done[k]) >= (self.workloads[k].num_requests or 0) for k in self.counted
        )

    def answered(self, request: SimRequest, now: float) -> None:
        """A request finished: its closed-loop client sends the next one, if any is left."""
        k = request.klass
        self.done[k].append(request)
        w = self.workloads[k]
        if w.concurrency is None:
            return
        more = not self.counted_done if w.background else self.issued[k] < (w.num_requests or 0)
        if more:
            self.send(k, now)


def simulate_workloads(
    cost: StepCost,
    workloads: Sequence[Workload],
    limits: SchedulerLimits,
    until_s: float | None = None,
    since_s: float | None = None,
) -> list[SimResult]:
    """Run the workloads through one simulated engine until every counted one is done (or,
    with `until_s`, until that simulated second); one result per workload, in order.
    A background workload's output is counted from `since_s` (default: when the first
    counted workload starts)."""
    if not workloads or (all(w.background for w in workloads) and until_s is None):
        raise PlanError("a simulation needs a workload with a request count, or an end time")
    engine = SimEngine(cost, limits)
    clients = _Clients(cost, workloads)
    window = min((workloads[k].delay_s for k in clients.counted), default=0.0)
    window = window if since_s is None else since_s
    tokens = [0] * len(workloads)
    now = 0.0
    while not clients.counted_done:
        if until_s is not None and now >= until_s:
            break
        while clients.arrivals and clients.arrivals[0][0] <= now:
            engine.add(heapq.heappop(clients.arrivals)[3])
        if engine.idle:
            if not clients.arrivals:
                break
            now = clients.arrivals[0][0]
            continue
        upcoming = clients.arrivals[0] if clients.arrivals else None
        next_arrival = None if upcoming is None else (upcoming[0], upcoming[3].priority)
        now, finished, sampled = engine.step(now, next_arrival)
        for request in sampled:
            tokens[request.klass] += request.advanced if now > window else 0
        for request in finished:
            clients.answered(request, now)
    return [
        _result(w, clients.sent[k], clients.done[k], tokens[k], window, now, engine)
        for k, w in enumerate(workloads)
    ]


def simulate(cost: StepCost, workload: Workload, limits: SchedulerLimits) -> SimResult:
    """Run one counted workload through the simulated engine until every request finished."""
    if workload.background:
        raise PlanError("a lone workload needs a request count")
    return simulate_workloads(cost, [workload], limits)[0]


def _result(
    workload: Workload,
    sent: list[SimRequest],
    done: list[SimRequest],
    tokens: int,
    window: float,
    end: float,
    engine: SimEngine,
) -> SimResult:
    ttft = [r.first_token - r.sent for r in sent if r.first_token is not None]
    tpot, e2e = [], []
    for request in done:
        assert request.first_token is not None and request.last_token is not None
        e2e.append(request.last_token - request.sent)
        if request.generated > 1:
            tpot.append((request.last_token - request.first_token) / (request.generated - 1))
    if workload.background:
        output, duration = tokens, end - window
    else:
        output = sum(r.generated for r in done)
        last = max((r.last_token or 0.0 for r in done), default=end)
        duration = last - min((r.sent for r in done), default=last)
    return SimResult(
        ttft=ttft,
        tpot=tpot,
        e2e=e2e,
        duration=duration,
        output_tokens=output,
        steps=engine.steps,
        peak_running=engine.peak_running,
        preemptions=engine.preemptions,
    )
