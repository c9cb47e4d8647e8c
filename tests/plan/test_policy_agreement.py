"""The engine's scheduler and the plan's simulation ask ``inhouse.scheduling`` for a step's
order through their own wrappers (``class_step.class_order`` over ``Sequence``s,
``SimEngine.step_order`` over ``SimRequest``s): given the same candidates, step after step,
they must get the same order, the same background rows and the same prefill cap, or the
plan's latency predictions drift from what the engine runs.

Hypothesis draws the arrivals (priority, tenant, lengths) and, each step, which waiting
candidates start, which running one is preempted; both sides then take the same tokens
(each candidate its want, in the order, while the budget lasts) and finish the same
requests, through each side's own entry points (``add``, the policy's charge, ``finish``).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from inhouse.engine.class_step import class_order
from inhouse.engine.config import EngineConfig, background_decode_rows, prefill_cap
from inhouse.engine.kv_cache import KVCacheManager
from inhouse.engine.sampling_params import SamplingParams
from inhouse.engine.scheduler import Scheduler
from inhouse.engine.sequence import Sequence, SequenceStatus
from inhouse.plan.perf_model import StepCost
from inhouse.plan.sim_engine import SchedulerLimits, SimEngine
from inhouse.plan.sim_request import SimRequest
from inhouse.scheduling.background import Background

BS = 16
BUDGET = 64
FLAT = StepCost(base_s=0.01, weights_s=0.0, token_s=0.0, seq_s=0.0, context_s=0.0, pair_s=0.0)


@dataclass(frozen=True, slots=True)
class Spec:
    priority: int
    tenant: str
    prompt: int
    output: int


@dataclass(frozen=True, slots=True)
class Event:
    """One step: who arrives before it, which waiting candidates it starts (by position in
    the order), whether it preempts the newest running one first."""

    arrivals: list[Spec]
    starts: list[bool]
    preempt: bool


specs = st.builds(
    Spec,
    priority=st.integers(-1, 1),
    tenant=st.sampled_from(["a", "b", "c"]),
    prompt=st.integers(1, 150),
    output=st.integers(1, 30),
)
events = st.builds(
    Event,
    arrivals=st.lists(specs, max_size=4),
    starts=st.lists(st.booleans(), min_size=6, max_size=6),
    preempt=st.booleans(),
)


@dataclass(slots=True)
class Pair:
    """One request on both sides."""

    name: str
    seq: Sequence
    req: SimRequest


class Sides:
    """A real ``Scheduler`` and a real ``SimEngine`` holding the same candidates."""

    def __init__(self, policy: str, seats: int, cap: int, rows: int) -> None:
        config = EngineConfig(
            scheduling_policy=policy, max_num_seqs=seats, max_num_batched_tokens=BUDGET,
            long_prefill_token_threshold=cap, background_decode_rows=rows,
        )  # fmt: skip
        self.sched = Scheduler(
            KVCacheManager(512, BS), seats, BUDGET, 4096, (), 1.0, policy,
            prefill_cap(config), background_decode_rows(config),
        )  # fmt: skip
        limits = SchedulerLimits(
            seats, BUDGET, block_size=BS, policy=policy,
            long_prefill_token_threshold=cap, background_decode_rows=rows,
        )  # fmt: skip
        self.sim = SimEngine(FLAT, limits)
        self.pairs: dict[int, Pair] = {}  # by the engine's seq_id
        self.by_req: dict[int, Pair] = {}  # by the simulation's seq_id
        self.step: tuple[list[Sequence], Background | None, int] = ([], None, 0)

    def arrive(self, spec: Spec) -> None:
        name = f"r{len(self.pairs)}"
        params = SamplingParams(max_tokens=spec.output)
        seq = Sequence(
            name, [7] * spec.prompt, params, cache_salt=spec.tenant, priority=spec.priority,
            arrival_time=float(self.sim.arrived),
        )  # fmt: skip
        req = SimRequest(spec.prompt, spec.output, 0.0, priority=spec.priority, tenant=spec.tenant)
        self.sched.add([seq])
        self.sim.add(req)
        self.pairs[seq.seq_id] = self.by_req[req.seq_id] = Pair(name, seq, req)

    def orders(self) -> tuple[tuple, tuple]:
        """Each side's step: (names in order, background by names, cap)."""
        self.sched.steps += 1  # as Scheduler.schedule counts before it orders
        self.step = engine, engine_bg, engine_cap = class_order(self.sched)
        sim, sim_bg, sim_cap = self.sim.step_order()
        engine_names = [self.pairs[s.seq_id].name for s in engine]
        sim_names = [self.by_req[r.seq_id].name for r in sim]
        return (
            (engine_names, self._names(engine_bg, self.pairs), engine_cap),
            (sim_names, self._names(sim_bg, self.by_req), sim_cap),
        )

    @staticmethod
    def _names(background: Background | None, pairs: dict[int, Pair]) -> tuple | None:
        if background is None:
            return None
        allowed = sorted(pairs[i].name for i in background.allowed)
        return (background.above, allowed, background.prefills)

    def preempt_newest(self) -> None:
        if not self.sched.running:
            return
        seq = self.sched.running[-1]
        pair = self.pairs[seq.seq_id]
        self.sched.running.remove(seq)
        seq.num_computed_tokens, seq.status = 0, SequenceStatus.WAITING
        self.sched.waiting.appendleft(seq)
        self.sim.running.remove(pair.req)
        pair.req.running, pair.req.computed = False, 0
        self.sim.waiting.append(pair.req)

    def take(self, starts: list[bool]) -> None:
        """Give each candidate in the engine's order its want while the budget lasts,
        starting the waiting ones ``starts`` picks (while seats last), on both sides."""
        order, background, cap = self.step
        budget, batch, asked = BUDGET, [], iter(starts * 50)
        for seq in order:
            if budget <= 0:
                break
            if background is not None and background.holds_back(seq):
                continue
            pair = self.pairs[seq.seq_id]
            if not seq.running:
                if len(self.sched.running) >= self.sched.max_num_seqs or not next(asked):
                    continue
                self.sched.waiting.remove(seq)
                self.sched.running.append(seq)
                seq.status = SequenceStatus.RUNNING
                self.sim.waiting.remove(pair.req)
                self.sim.running.append(pair.req)
                pair.req.running = True
            left = seq.tokens_left
            n = min(1 if left == 1 else min(left, cap), budget)
            budget -= n
            batch.append((pair, n))
        self._apply(batch)

    def _apply(self, batch: list[tuple[Pair, int]]) -> None:
        self.sched.policy.charge([(p.seq, n) for p, n in batch])
        self.sim.policy.charge([(p.req, n) for p, n in batch])
        self.sim.steps += 1
        for pair, n in batch:
            seq, req = pair.seq, pair.req
            seq.num_computed_tokens += n
            req.computed += n
            seq.last_step, req.last_step = self.sched.steps, self.sim.steps
            if seq.tokens_left:
                continue
            seq.token_ids.append(7)
            req.generated += 1
            if req.finished:
                self.sched.finish(seq, "length")
                self.sim.running.remove(req)
                req.running = False
                self.sim.policy.finish(req.tenant)


@settings(max_examples=100, deadline=None)
@given(
    policy=st.sampled_from(["priority", "fair"]),
    seats=st.integers(1, 4),
    cap=st.integers(1, BUDGET),
    rows=st.integers(0, 4),
    steps=st.lists(events, min_size=8, max_size=40),
)
def test_engine_and_plan_get_the_same_order_step_after_step(
    policy: str, seats: int, cap: int, rows: int, steps: list[Event]
) -> None:
    sides = Sides(policy, seats, cap, rows)
    for number, event in enumerate(steps, 1):
        for spec in event.arrivals:
            sides.arrive(spec)
        if event.preempt:
            sides.preempt_newest()
        engine, sim = sides.orders()
        assert engine == sim, f"step {number}"
        sides.take(event.starts)
