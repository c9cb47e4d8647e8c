"""A discrete-event simulation of one continuous-batching engine replica, step by step.

The scheduler is the engine's (vLLM v1's): each step running sequences go first and
each takes ``min(tokens not yet computed, budget left)``; then waiting requests are
admitted in arrival order while the budget lasts, ``max_num_seqs`` allows and the KV
cache can hold every admitted request to its ``max_tokens``. A step's length comes from
a `StepCost`; a sequence whose prompt is all computed samples a token at the step's end.
Clients are closed-loop (``concurrency`` in flight, the next sent when one finishes) or
open-loop (Poisson arrivals at ``rate``). Queueing is what a closed formula leaves out,
and what sets TTFT near the knee.
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
from collections import deque
from dataclasses import dataclass, field

from inhouse.plan.errors import PlanError
from inhouse.plan.perf_model import StepCost, prefill_pairs


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests as the benchmark sends them: token lengths uniform in mean·(1 ± spread)."""

    prompt_tokens: int
    output_tokens: int
    num_requests: int
    concurrency: int | None = None  # closed loop
    rate: float | None = None  # open loop, requests per second (Poisson)
    spread: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise PlanError("a workload needs exactly one of concurrency (closed) or rate (open)")
        if min(self.prompt_tokens, self.output_tokens, self.num_requests) < 1:
            raise PlanError("prompt tokens, output tokens and requests must be at least 1")
        if self.concurrency is not None and self.concurrency < 1:
            raise PlanError(f"concurrency must be at least 1, not {self.concurrency}")
        if self.rate is not None and not self.rate > 0:
            raise PlanError(f"the request rate must be positive, not {self.rate}")
        if not 0 <= self.spread < 1:
            raise PlanError(f"the length spread must lie in [0, 1), not {self.spread}")


@dataclass(frozen=True, slots=True)
class SchedulerLimits:
    """The engine's flags that shape a step; ``kv_tokens`` None means the KV cache never binds."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    chunked_prefill: bool = True
    kv_tokens: int | None = None
    block_size: int = 16

    def __post_init__(self) -> None:
        if min(self.max_num_seqs, self.max_num_batched_tokens, self.block_size) < 1:
            raise PlanError("max_num_seqs, max_num_batched_tokens and block size must be ≥ 1")


@dataclass(slots=True)
class _Request:
    prompt: int
    output: int
    sent: float
    computed: int = 0
    generated: int = 0
    first_token: float | None = None
    last_token: float | None = None

    @property
    def uncomputed(self) -> int:
        # Every sampled token is fed back once in the next step.
        return self.prompt + self.generated - self.computed

    def blocks_to_finish(self, block_size: int) -> int:
        return math.ceil((self.prompt + self.output - 1) / block_size)


@dataclass(frozen=True, slots=True)
class SimResult:
    """Per-request latencies (seconds) and the run's totals."""

    ttft: list[float]
    tpot: list[float]
    e2e: list[float]
    duration: float
    output_tokens: int
    steps: int
    peak_running: int

    def ttft_p(self, q: int) -> float:
        """The q-th percentile (0–100) of TTFT, linear between ranks as numpy and `bench`."""
        return quantile(self.ttft, q)

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


def _lengths(workload: Workload) -> list[tuple[int, int]]:
    rng = random.Random(workload.seed)

    def draw(mean: int) -> int:
        low, high = round(mean * (1 - workload.spread)), round(mean * (1 + workload.spread))
        return max(1, rng.randint(low, high))

    return [
        (draw(workload.prompt_tokens), draw(workload.output_tokens))
        for _ in range(workload.num_requests)
    ]


@dataclass(slots=True)
class _Engine:
    cost: StepCost
    limits: SchedulerLimits
    waiting: deque[_Request] = field(default_factory=deque)
    running: list[_Request] = field(default_factory=list)
    steps: int = 0
    peak_running: int = 0

    def _fits(self, request: _Request) -> bool:
        if self.limits.kv_tokens is None:
            return True
        size = self.limits.block_size
        total = self.limits.kv_tokens // size
        reserved = sum(r.blocks_to_finish(size) for r in self.running)
        return not self.running or reserved + request.blocks_to_finish(size) <= total

    def step(self, now: float) -> tuple[float, list[_Request]]:
        """Run one step from `now`; returns its end and the requests it finished."""
        budget = self.limits.max_num_batched_tokens
        prefill = decodes = context = pairs = 0
        batch: list[tuple[_Request, int]] = []
        for request in self.running:
            take = min(request.uncomputed, budget)
            if take <= 0:
                continue
            budget -= take
            batch.append((request, take))
            if request.computed >= request.prompt:
                decodes += 1
                context += request.computed + 1
            else:
                prefill += take
                pairs += prefill_pairs(request.computed, take)
        while self.waiting and budget > 0 and len(self.running) < self.limits.max_num_seqs:
            request = self.waiting[0]
            if not self.limits.chunked_prefill and request.prompt > budget:
                break
            if not self._fits(request):
                break
            self.waiting.popleft()
            take = min(request.prompt, budget)
            budget -= take
            self.running.append(request)
            batch.append((request, take))
            prefill += take
            pairs += prefill_pairs(0, take)
        if not batch:
            raise PlanError(
                f"a {self.waiting[0].prompt}-token prompt never fits a step of "
                f"{self.limits.max_num_batched_tokens} tokens without chunked prefill"
            )
        self.peak_running = max(self.peak_running, len(self.running))
        end = now + self.cost.step_time(prefill, decodes, context, pairs)
        self.steps += 1
        finished = []
        for request, take in batch:
            request.computed += take
            if request.computed < request.prompt:
                continue
            request.generated += 1
            request.last_token = end
            if request.first_token is None:
                request.first_token = end
            if request.generated >= request.output:
                finished.append(request)
        for request in finished:
            self.running.remove(request)
        return end, finished


def simulate(cost: StepCost, workload: Workload, limits: SchedulerLimits) -> SimResult:
    """Run the workload through the simulated engine until every request finished."""
    lengths = _lengths(workload)
    engine = _Engine(cost, limits)
    arrivals: list[tuple[float, int]] = []  # (time it reaches the engine, index)
    sent_at: list[float] = []
    rng = random.Random(workload.seed + 1)

    def send(index: int, at: float) -> None:
        sent_at.append(at)
        heapq.heappush(arrivals, (at + cost.request_s, index))

    if workload.concurrency is not None:
        for index in range(min(workload.concurrency, workload.num_requests)):
            send(index, 0.0)
    else:
        assert workload.rate is not None
        at = 0.0
        for index in range(workload.num_requests):
            send(index, at)
            at += rng.expovariate(workload.rate)
    next_index = len(sent_at)
    done: list[_Request] = []
    now = 0.0
    while len(done) < workload.num_requests:
        while arrivals and arrivals[0][0] <= now:
            _, index = heapq.heappop(arrivals)
            prompt, output = lengths[index]
            engine.waiting.append(_Request(prompt, output, sent_at[index]))
        if not engine.running and not engine.waiting:
            now = arrivals[0][0]
            continue
        now, finished = engine.step(now)
        for request in finished:
            done.append(request)
            if workload.concurrency is not None and next_index < workload.num_requests:
                send(next_index, now)
                next_index += 1
    return _result(done, now, engine)


def _result(done: list[_Request], end: float, engine: _Engine) -> SimResult:
    ttft, tpot, e2e = [], [], []
    for request in done:
        assert request.first_token is not None and request.last_token is not None
        ttft.append(request.first_token - request.sent)
        e2e.append(request.last_token - request.sent)
        if request.generated > 1:
            tpot.append((request.last_token - request.first_token) / (request.generated - 1))
    start = min(r.sent for r in done)
    return SimResult(
        ttft=ttft,
        tpot=tpot,
        e2e=e2e,
        duration=end - start,
        output_tokens=sum(r.generated for r in done),
        steps=engine.steps,
        peak_running=engine.peak_running,
    )
