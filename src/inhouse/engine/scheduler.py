"""Continuous batching as in vLLM v1: no prefill/decode phases, just catching up under a budget.

Each step, running sequences go first, then waiting ones; each gets
``min(tokens it has not computed, tokens left in the step budget)``, so long
prompts are prefilled in chunks alongside decodes. When the block pool runs dry
the newest running sequence is preempted: its blocks are freed and it goes back
to the head of the waiting queue, to be recomputed (mostly from the prefix cache)
later. Waiting sequences are admitted only in steps without preemption.

The scheduler only decides; ``KVCacheManager`` accounts; the runner computes.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from inhouse.engine.kv_cache import KVCacheManager
from inhouse.engine.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class SchedulerOutput:
    """What to run this step: ``(sequence, number of tokens)`` in batch order."""

    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class Scheduler:
    """Holds the waiting and running queues and picks each step's batch."""

    def __init__(
        self, kv_cache: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int
    ) -> None:
        self.kv_cache = kv_cache
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._leaders: dict[str, Sequence] = {}

    def add(self, seqs: list[Sequence]) -> None:
        """Queue the sibling sequences of one request (index 0 leads the prompt)."""
        self._leaders[seqs[0].request_id] = seqs[0]
        self.waiting.extend(seqs)

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.max_num_batched_tokens)
        if not out.preempted:
            self._schedule_waiting(out, budget)
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if num_new <= 0:
                i += 1
                continue
            while not self.kv_cache.allocate_slots(seq, num_new):
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            else:
                out.scheduled.append((seq, num_new))
                budget -= num_new
                i += 1
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        skipped: list[Sequence] = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if self._waits_for_leader(seq):
                skipped.append(self.waiting.popleft())
                continue
            cached = self.kv_cache.find_cached_prefix(seq)
            num_cached = len(cached) * self.kv_cache.block_size
            num_new = min(seq.num_tokens - num_cached, budget)
            if not self.kv_cache.allocate_slots(seq, num_new, cached):
                break
            self.waiting.popleft()
            self.kv_cache.record_lookup(seq.num_tokens, num_cached)
            seq.num_computed_tokens = num_cached
            if seq.first_scheduled_time is None:
                seq.num_cached_tokens = num_cached
                seq.first_scheduled_time = time.monotonic()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append((seq, num_new))
            budget -= num_new
        self.waiting.extendleft(reversed(skipped))

    def _waits_for_leader(self, seq: Sequence) -> bool:
        """Siblings start after their leader computed the prompt, so they share its blocks."""
        if seq.index == 0:
            return False
        leader = self._leaders.get(seq.request_id)
        return (
            leader is not None
            and not leader.is_finished
            and leader.num_computed_tokens < leader.num_prompt_tokens
        )

    def _preempt(self, seq: Sequence) -> None:
        self.kv_cache.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, seq: Sequence, reason: str, stop_reason: int | str | None = None) -> None:
        """Mark a sequence finished and return its blocks (it must be running or waiting)."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        else:
            return
        self.kv_cache.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.stop_reason = stop_reason

    def forget(self, request_id: str) -> None:
        """Drop the request's leader record once all its sequences are finished."""
        self._leaders.pop(request_id, None)
