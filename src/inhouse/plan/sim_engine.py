"""The simulated engine: one continuous-batching replica's waiting and running sets, a step
at a time, under one of the engine's scheduling policies (`inhouse.scheduling`, the same
code the engine's scheduler asks for its order).

Each step offers ``max_num_batched_tokens`` to sequences in the policy's order: a decode
takes 1 token; a prefill (a running sequence's next chunk, or a waiting one being admitted)
takes ``min(tokens not yet computed, budget left, prefill tokens left)``. A waiting sequence
is admitted while ``max_num_seqs`` allows and the KV cache can hold every running request
(and it) to its ``max_tokens``; admission stops at the first that cannot be. Under
``priority`` and ``fair`` the step's prefill tokens are capped at the long-prefill threshold
when more than one sequence wants the step, a worse priority gets no prefill tokens once a
better one got some, and a waiting sequence that cannot be admitted preempts the worst
running one of strictly worse priority (at most one a step; its full KV blocks stay in the
prefix cache, so it recomputes only the rest). While a better priority is urgent (a
candidate within the last `URGENT_HOLD_STEPS` steps) worse work runs in turns
(`inhouse.scheduling.background`): none while the urgent level has prefill left,
at most ``background_decode_rows`` decodes beside it decoding, and `GAP_ROWS` decode and
no prefill while it has no candidate. A step's length comes from a `StepCost`; a
sequence that has caught up samples a token at the step's end. Under ``priority`` and
``fair`` a request that arrives during a step of only worse work stops that step at its
arrival (the engine's step interrupt): nothing of it is computed, and its time is lost.

With ``speculation`` (`inhouse.plan.speculation`), a step whose decoding sequences are no
more than its ``disable_by_batch_size`` verifies K draft tokens for each: K more decode rows
with that sequence's context, as the engine's step runs them. Each such sequence then
advances by the mean accepted length, as a fractional credit it carries from step to step
(whole tokens taken, never more than it still has to generate).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inhouse.plan.errors import PlanError
from inhouse.plan.perf_model import StepCost, prefill_pairs
from inhouse.plan.scheduling import check_policy
from inhouse.plan.sim_request import SimRequest
from inhouse.plan.speculation import Speculation
from inhouse.scheduling.background import Background
from inhouse.scheduling.candidate import rank
from inhouse.scheduling.policy import (
    DEFAULT_BACKGROUND_DECODE_ROWS,
    DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD,
    SchedulingPolicy,
)


@dataclass(frozen=True, slots=True)
class SchedulerLimits:
    """The engine's flags that shape a step; ``kv_tokens`` None means the KV cache never binds.

    ``long_prefill_token_threshold`` caps a step's prefill tokens under ``priority`` and
    ``fair`` (None: the engine's default, 128; 0: no cap); ``fcfs`` has no cap.
    ``background_decode_rows`` caps, under ``priority`` and ``fair``, a step's worse-priority
    decodes while better work is urgent (None: the engine's default, 4; 0: no cap).
    ``speculation`` None: no speculative decoding.
    """

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    chunked_prefill: bool = True
    kv_tokens: int | None = None
    block_size: int = 16
    policy: str = "fcfs"
    long_prefill_token_threshold: int | None = None
    background_decode_rows: int | None = None
    speculation: Speculation | None = None

    def __post_init__(self) -> None:
        if min(self.max_num_seqs, self.max_num_batched_tokens, self.block_size) < 1:
            raise PlanError("max_num_seqs, max_num_batched_tokens and block size must be ≥ 1")
        check_policy(self.policy)
        if (self.long_prefill_token_threshold or 0) < 0:
            raise PlanError("the long-prefill token threshold must be 0 (no cap) or more")
        if (self.background_decode_rows or 0) < 0:
            raise PlanError("the background decode rows must be 0 (no cap) or more")

    @property
    def prefill_threshold(self) -> int:
        """The effective cap on a step's prefill tokens; 0 means none (always under fcfs)."""
        if self.policy == "fcfs":
            return 0
        if self.long_prefill_token_threshold is not None:
            return self.long_prefill_token_threshold
        return DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD

    @property
    def background_rows(self) -> int:
        """The effective cap on worse-priority decodes; 0 means none (always under fcfs)."""
        if self.policy == "fcfs":
            return 0
        rows = self.background_decode_rows
        return DEFAULT_BACKGROUND_DECODE_ROWS if rows is None else rows


@dataclass(slots=True)
class _Step:
    """What one step scheduled so far."""

    budget: int
    prefill_left: int
    batch: list[tuple[SimRequest, int]] = field(default_factory=list)
    prefill: int = 0
    decodes: int = 0
    context: int = 0
    pairs: int = 0
    best_prefill: int | None = None  # the priority of the first sequence given prefill

    def take(self, request: SimRequest, tokens: int, step: int) -> None:
        self.budget -= tokens
        self.batch.append((request, tokens))
        request.last_step = step
        if request.decoding:
            self.decodes += 1
            self.context += request.computed + 1
            return
        self.prefill += tokens
        self.prefill_left -= tokens
        self.pairs += prefill_pairs(request.computed, tokens)
        if self.best_prefill is None:
            self.best_prefill = request.priority

    def may_prefill(self, request: SimRequest, policy: str) -> bool:
        """Prefill cap left, and (but under fcfs) no better priority given prefill yet."""
        best = self.best_prefill
        worse = policy != "fcfs" and best is not None and request.priority > best
        return self.prefill_left > 0 and not worse


@dataclass(slots=True)
class SimEngine:
    """The waiting and running requests and the counters of a run."""

    cost: StepCost
    limits: SchedulerLimits
    waiting: list[SimRequest] = field(default_factory=list)
    running: list[SimRequest] = field(default_factory=list)
    policy: SchedulingPolicy = field(init=False)
    steps: int = 0
    peak_running: int = 0
    preemptions: int = 0
    abandoned: int = 0  # steps a better request's arrival stopped
    arrived: int = 0

    def __post_init__(self) -> None:
        self.policy = SchedulingPolicy(self.limits.policy, self.limits.background_rows)

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    def add(self, request: SimRequest) -> None:
        """A request reaches the engine."""
        request.arrival = self.arrived
        self.arrived += 1
        self.waiting.append(request)
        self.policy.arrive(request.tenant)

    def _blocks(self, request: SimRequest) -> int:
        return request.blocks_to_finish(self.limits.block_size)

    def _admissible(self, request: SimRequest, reserved: int) -> bool:
        if len(self.running) >= self.limits.max_num_seqs:
            return False
        if self.limits.kv_tokens is None or not self.running:
            return True
        total = self.limits.kv_tokens // self.limits.block_size
        return reserved + self._blocks(request) <= total

    def _preempt_for(self, request: SimRequest, scheduled: set[int]) -> int:
        """Preempt the worst running request of strictly worse priority than `request`
        (largest priority, newest); the blocks it gives back, 0 when there is none."""
        victims = [
            r for r in self.running if r.priority > request.priority and r.seq_id not in scheduled
        ]
        if not victims:
            return 0
        victim = max(victims, key=rank)
        self.running.remove(victim)
        victim.running = False
        size = self.limits.block_size
        victim.computed = min(victim.computed, victim.prompt + victim.generated - 1) // size * size
        self.waiting.append(victim)
        self.preemptions += 1
        return self._blocks(victim)

    def step_order(self) -> tuple[list[SimRequest], Background | None, int]:
        """The next step's candidates in the policy's order, the worse work that waits, and
        the most prefill tokens one candidate may take (the whole budget for a lone one)."""
        limits = self.limits
        budget = limits.max_num_batched_tokens
        lone = len(self.running) + len(self.waiting) == 1
        cap = budget if lone else min(limits.prefill_threshold or budget, budget)
        seats_free = len(self.running) < limits.max_num_seqs
        now = self.steps + 1  # the engine numbers steps from 1
        order, background = self.policy.order([*self.running, *self.waiting], cap, seats_free, now)
        return order, background, cap

    def _plan(self) -> _Step:
        limits, policy = self.limits, self.limits.policy
        order, background, cap = self.step_order()
        step = _Step(limits.max_num_batched_tokens, cap)
        now = self.steps + 1
        reserved = sum(self._blocks(r) for r in self.running)
        admitting, preempted = True, False
        for request in order:
            if step.budget <= 0:
                break
            if request.decoding:
                if background is None or not background.holds_back(request):
                    step.take(request, 1, now)
                continue
            held = background is not None and background.holds_back(request)
            if held or not step.may_prefill(request, policy) or not (request.running or admitting):
                continue
            if not request.running:
                if not self._admissible(request, reserved) and policy != "fcfs" and not preempted:
                    freed = self._preempt_for(request, {r.seq_id for r, _ in step.batch})
                    preempted, reserved = freed > 0, reserved - freed
                fits_budget = limits.chunked_prefill or request.uncomputed <= step.budget
                if not fits_budget or not self._admissible(request, reserved):
                    admitting = False
                    continue
                self.waiting.remove(request)
                self.running.append(request)
                request.running = True
                reserved += self._blocks(request)
            step.take(request, min(request.uncomputed, step.budget, step.prefill_left), now)
        return step

    def _stopped_by(self, step: _Step, end: float, arrival: tuple[float, int] | None) -> bool:
        if self.limits.policy == "fcfs" or arrival is None or arrival[0] >= end:
            return False
        return arrival[1] < min(request.priority for request, _ in step.batch)

    def _step_time(self, step: _Step, drafts: int) -> float:
        """The step's length; `drafts` tokens verified for each decoding sequence, each a
        decode row attending over its sequence's context and the drafts before it."""
        rows = step.decodes * (1 + drafts)
        context = step.context * (1 + drafts) + step.decodes * drafts * (drafts + 1) // 2
        return self.cost.step_time(step.prefill, rows, context, step.pairs)

    def step(
        self, now: float, next_arrival: tuple[float, int] | None = None
    ) -> tuple[float, list[SimRequest], list[SimRequest]]:
        """Run one step from `now`: its end, the requests it finished, those that sampled.
        ``next_arrival`` (time, priority) of the next request: under priority and fair, one
        arriving before the step ends with a priority better than all of the step's work
        stops it there (the engine's step interrupt), with nothing computed."""
        preemptions = self.preemptions
        step = self._plan()
        if not step.batch and self.preemptions > preemptions:
            self.steps += 1  # the engine's empty step: it only made room for a better priority
            self.policy.charge([])
            return now, [], []
        if not step.batch:
            raise PlanError(
                f"a {self.waiting[0].prompt}-token prompt never fits a step of "
                f"{self.limits.max_num_batched_tokens} tokens without chunked prefill"
            )
        self.peak_running = max(self.peak_running, len(self.running))
        spec = self.limits.speculation
        drafting = spec is not None and spec.drafts_at(step.decodes)
        end = now + self._step_time(step, spec.rows_per_draft if drafting else 0)
        self.steps += 1
        if self._stopped_by(step, end, next_arrival):
            assert next_arrival is not None
            self.abandoned += 1
            self.policy.charge([])
            return next_arrival[0], [], []
        sampled, finished = [], []
        self.policy.charge(step.batch)
        for request, tokens in step.batch:
            decoded = request.decoding
            request.computed += tokens
            if request.uncomputed > 0:
                continue
            advance = 1
            if drafting and decoded:
                assert spec is not None
                advance = request.speculate(spec.mean_accepted_length)
                request.computed += advance - 1  # accepted drafts' KV was computed verifying
            request.generated += advance
            request.advanced = advance
            request.last_token = end
            if request.first_token is None:
                request.first_token = end
            sampled.append(request)
            if request.finished:
                finished.append(request)
        for request in finished:
            self.running.remove(request)
            request.running = False
            self.policy.finish(request.tenant)
        return end, finished, sampled
