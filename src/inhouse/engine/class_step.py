"""One step's batch under ``--scheduling-policy priority`` or ``fair``.

Running and waiting sequences are candidates of one list, in ``fair_share.step_order``.
Walking it, a decode gets its token (and draft) while the step budget lasts; a prefill,
of a running sequence or of a waiting one being admitted, gets at most what is left of
the step's prefill cap (``Scheduler.prefill_cap``, the whole budget for a lone
candidate), so one long prompt cannot take a step while another request waits. Once a
sequence of some priority got prefill tokens, worse priorities get none this step (they
still decode). Admission keeps the order (the first waiting sequence that cannot start
stops admission for the step) and the KV reservation of fcfs.

A waiting sequence that cannot start (seats or KV short) while a running sequence of a
strictly worse priority exists preempts the worst running one (largest priority, newest):
at most one such preemption a step, and the victim's full blocks stay in the prefix cache,
so its recompute is mostly cache hits (cause "priority"). Out of blocks, the worst-class
running sequence not yet scheduled is preempted (cause "kv"), as fcfs preempts its newest.

Background rows: while work of a better priority is urgent (a candidate now, or within
the last ``URGENT_HOLD_STEPS`` steps), worse work runs in turns, the decodes that ran
least recently first (of those the step's order holds):

- beside better work that prefills (or waits to), nothing: its first token's step is short;
- beside better work that decodes, at most ``Scheduler.background_rows`` decodes (and
  prefill within the cap);
- between better requests (urgent, but none a candidate: a client sending its next
  request), ``GAP_ROWS`` decode and no prefill, since the next one will wait for that step.

A request that arrives mid-step waits for that step, and a CPU step's time grows with its
rows, so short steps where urgent work arrives bound interactive TTFT, while the steps
beside a decoding request (most of them) keep the batch's rate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from inhouse.engine.fair_share import class_key, step_order
from inhouse.engine.sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from inhouse.engine.scheduler import Scheduler, SchedulerOutput

URGENT_HOLD_STEPS = 32  # a chat client's next request comes within a few steps of the last
GAP_ROWS = 1  # worse decodes a step runs between urgent requests (0 would spin empty steps)


class Urgency:
    """The best priority seen among the candidates of the last ``URGENT_HOLD_STEPS`` steps."""

    def __init__(self) -> None:
        self._seen: dict[int, int] = {}  # priority -> the last step it was a candidate

    def level(self, candidates: list[Sequence], step: int) -> int | None:
        """Record this step's candidates; the best priority still held (None: none)."""
        for seq in candidates:
            self._seen[seq.priority] = step
        self._seen = {p: at for p, at in self._seen.items() if step - at <= URGENT_HOLD_STEPS}
        return min(self._seen, default=None)


@dataclass(frozen=True, slots=True)
class Background:
    """This step's work of a priority worse than ``above``: only the decodes in ``allowed``,
    and prefill only if ``prefills``."""

    above: int
    allowed: frozenset[int]
    prefills: bool = True

    def holds_back(self, seq: Sequence) -> bool:
        """Whether a worse sequence's decode (or, without ``prefills``, prefill) waits."""
        if seq.priority <= self.above:
            return False
        return seq.seq_id not in self.allowed if _left(seq) == 1 else not self.prefills


def background_rows(
    sched: Scheduler, order: list[Sequence], urgent: int | None
) -> Background | None:
    """Which worse-priority decodes this step runs (None: every one), picked from the
    step's order: under fair a tenant that yields the step has none there, so its decodes
    never take a row the others could have used (the step would run empty)."""
    if not sched.background_rows or urgent is None:
        return None
    urgent_here = [s for s in order if s.priority == urgent]
    if any(_left(s) > 1 for s in urgent_here):
        return Background(urgent, frozenset())  # better work prefills: a short step
    rows = sched.background_rows if urgent_here else GAP_ROWS
    decodes = [s for s in order if s.priority > urgent and _left(s) == 1]
    if urgent_here and len(decodes) <= rows:
        return None
    decodes.sort(key=lambda s: s.last_step)  # the longest without a turn first
    allowed = frozenset(s.seq_id for s in decodes[:rows])
    return Background(urgent, allowed, prefills=bool(urgent_here))


def _left(seq: Sequence) -> int:
    return seq.num_tokens - seq.num_computed_tokens


def schedule_by_class(
    sched: Scheduler, out: SchedulerOutput, drafts: Mapping[int, list[int]]
) -> None:
    """Fill ``out`` with the step's batch (see the module docstring)."""
    candidates = [s for s in sched.running if s.num_tokens > s.num_computed_tokens]
    candidates += [s for s in sched.waiting if not sched.waits_for_leader(s)]
    budget = sched.max_num_batched_tokens
    prefill_left = budget if len(candidates) == 1 else sched.prefill_cap

    def want(seq: Sequence) -> int:
        left = seq.num_tokens - seq.num_computed_tokens
        return 1 if left == 1 else min(left, prefill_left)

    step = _Step(sched, out, budget, prefill_left)
    urgent = sched.urgency.level(candidates, sched.steps)
    seats_free = len(sched.running) < sched.max_num_seqs
    order = step_order(candidates, want, sched.shares, seats_free)
    step.background = background_rows(sched, order, urgent)
    for seq in order:
        if step.budget <= 0:
            break
        if seq in out.preempted:
            continue
        if seq.status is SequenceStatus.RUNNING:
            step.run(seq, drafts)
        elif step.admitting:
            step.admit(seq)
    if sched.shares is not None:
        sched.shares.charge(out.scheduled)


class _Step:
    """What is left of one step as its candidates are walked."""

    def __init__(
        self, sched: Scheduler, out: SchedulerOutput, budget: int, prefill_left: int
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
        self.background: Background | None = None  # see background_rows

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
        left = seq.num_tokens - seq.num_computed_tokens
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
        return max(unscheduled, key=class_key)

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
        victim = max(worse, key=class_key)
        self.reserved -= self.sched.blocks_to_finish(victim)
        self.sched.preempt(self.out, victim, "priority")
        self.yielded = True
        return True
