"""One step's batch under ``--scheduling-policy priority`` or ``fair``.

Running and waiting sequences are candidates of one list, in the order the scheduler's
``SchedulingPolicy`` gives. Walking it, a decode gets its token (and draft) while the step
budget lasts; a prefill, of a running sequence or of a waiting one being admitted, gets at
most what is left of the step's prefill cap (``Scheduler.prefill_cap``, the whole budget
for a lone candidate), so one long prompt cannot make a step long while another request
waits. The cap is the step's, not each request's: within one priority a waiting prefill
comes after a running one in arrival order, and gets tokens once that one's prompt is done.
Once a sequence of some priority got prefill tokens, worse priorities get none this step
(they still decode). Admission keeps the order (the first waiting sequence that cannot
start stops admission for the step) and the KV reservation of fcfs.

A waiting sequence that cannot start (seats or KV short) while a running sequence of a
strictly worse priority exists preempts the worst running one (largest priority, newest):
at most one such preemption a step, and the victim's full blocks stay in the prefix cache,
so its recompute is mostly cache hits (cause "priority"). Out of blocks, the worst-class
running sequence not yet scheduled is preempted (cause "kv"), as fcfs preempts its newest.

Which worse work waits while better work is urgent (background rows) and the order
itself (priority, tenants' fair shares) come from ``inhouse.scheduling``, which the plan's
simulation walks too; this module keeps the step's budget, admission and preemption.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Protocol

from inhouse.engine.scheduler_output import SchedulerOutput
from inhouse.engine.sequence import Sequence, SequenceStatus
from inhouse.scheduling.background import Background
from inhouse.scheduling.candidate import rank
from inhouse.scheduling.policy import SchedulingPolicy


class Host(Protocol):
    """What a class step asks of the scheduler that runs it (``Scheduler``)."""

    running: list[Sequence]
    waiting: deque[Sequence]
    max_num_seqs: int
    max_num_batched_tokens: int
    prefill_cap: int
    steps: int
    policy: SchedulingPolicy
    place_running: Callable[..., int]  # see Scheduler.place_running

    def waits_for_leader(self, seq: Sequence) -> bool: ...
    def reserved_blocks(self) -> int: ...
    def blocks_to_finish(self, seq: Sequence, num_held: int | None = None) -> int: ...
    def admit(self, out: SchedulerOutput, seq: Sequence, limit: int, reserved: int) -> int: ...
    def preempt(self, out: SchedulerOutput, seq: Sequence, cause: str) -> None: ...


def class_order(sched: Host) -> tuple[list[Sequence], Background | None, int]:
    """The step's candidates in the policy's order, the worse work that waits, and the
    most prefill tokens one candidate may take (the whole budget for a lone candidate)."""
    candidates = [s for s in sched.running if s.tokens_left > 0]
    candidates += [s for s in sched.waiting if not sched.waits_for_leader(s)]
    cap = sched.max_num_batched_tokens if len(candidates) == 1 else sched.prefill_cap
    seats_free = len(sched.running) < sched.max_num_seqs
    order, background = sched.policy.order(candidates, cap, seats_free, sched.steps)
    return order, background, cap


def schedule_by_class(sched: Host, out: SchedulerOutput, drafts: Mapping[int, list[int]]) -> None:
    """Fill ``out`` with the step's batch (see the module docstring)."""
    order, background, prefill_left = class_order(sched)
    step = _Step(sched, out, sched.max_num_batched_tokens, prefill_left, background)
    for seq in order:
        if step.budget <= 0:
            break
        if seq in out.preempted:
            continue
        if seq.status is SequenceStatus.RUNNING:
            step.run(seq, drafts)
        elif step.admitting:
            step.admit(seq)
    sched.policy.charge(out.scheduled)


class _Step:
    """What is left of one step as its candidates are walked."""

    def __init__(
        self,
        sched: Host,
        out: SchedulerOutput,
        budget: int,
        prefill_left: int,
        background: Background | None,
    ) -> None:
        self.sched = sched
        self.out = out
        self.budget = budget
        self.prefill_left = prefill_left
        self.prefill_level: int | None = None  # the best priority given prefill tokens
        self.admitting = True
        self.yielded = False  # a priority preemption happened this step
        self.reserved = sched.reserved_blocks()
        self.scheduled: set[int] = set()
        self.background = background  # the worse work that waits

    def _may_prefill(self, seq: Sequence) -> bool:
        level, background = self.prefill_level, self.background
        if background is not None and background.holds_back(seq):
            return False
        return self.prefill_left > 0 and (level is None or seq.priority <= level)

    def _took(self, seq: Sequence, used: int, prefill: bool) -> None:
        self.budget -= used
        self.scheduled.add(seq.seq_id)
        seq.last_step = self.sched.steps
        if prefill and used:
            self.prefill_left -= used
            level = self.prefill_level
            self.prefill_level = seq.priority if level is None else min(level, seq.priority)

    def run(self, seq: Sequence, drafts: Mapping[int, list[int]]) -> None:
        left = seq.tokens_left
        prefill = left > 1
        if prefill and not self._may_prefill(seq):
            return
        if not prefill and self.background is not None and self.background.holds_back(seq):
            return
        num_new = min(left, self.budget, self.prefill_left) if prefill else 1
        before = len(self.out.preempted)
        used = self.sched.place_running(self.out, seq, num_new, self.budget, drafts, self._victim)
        if len(self.out.preempted) > before:
            self.admitting = False  # the pool ran dry: nothing new starts this step
        self._took(seq, used, prefill)

    def _victim(self) -> Sequence:
        """The worst-class running sequence not yet scheduled this step."""
        unscheduled = [s for s in self.sched.running if s.seq_id not in self.scheduled]
        return max(unscheduled, key=rank)

    def admit(self, seq: Sequence) -> None:
        if not self._may_prefill(seq):
            return
        sched = self.sched
        limit = min(self.budget, self.prefill_left)
        used = 0
        if len(sched.running) < sched.max_num_seqs:
            used = sched.admit(self.out, seq, limit, self.reserved)
        if not used and self._yield_to(seq):
            used = sched.admit(self.out, seq, limit, self.reserved)
        if not used:
            self.admitting = False  # no overtaking: later waiting sequences wait too
            return
        self.reserved += sched.blocks_to_finish(seq)
        self._took(seq, used, prefill=True)

    def _yield_to(self, seq: Sequence) -> bool:
        """Preempt the worst running sequence for ``seq`` if its priority is strictly worse
        (once a step); whether one was."""
        if self.yielded:
            return False
        worse = [s for s in self.sched.running if s.priority > seq.priority]
        worse = [s for s in worse if s.seq_id not in self.scheduled]
        if not worse:
            return False
        victim = max(worse, key=rank)
        self.reserved -= self.sched.blocks_to_finish(victim)
        self.sched.preempt(self.out, victim, "priority")
        self.yielded = True
        return True
