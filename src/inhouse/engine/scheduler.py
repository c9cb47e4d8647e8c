"""Continuous batching as in vLLM v1: no prefill/decode phases, just catching up under a budget.

``schedule`` picks a step's batch: running sequences go first, then waiting ones;
each gets ``min(tokens it has not computed, tokens left in the step budget)``, so long
prompts are prefilled in chunks alongside decodes. ``update`` owns the step's whole
aftermath: it advances computed tokens, caches full blocks, appends the sampled
tokens, finishes sequences on EOS, stop token ids, length or grammar end, and frees
their blocks.

Admission keeps the running set within what the KV cache can finish: a waiting
sequence starts only if the free blocks cover ``kv_reserve`` times the blocks every
running sequence (and it) still needs to reach its length limit. Preemption stays as
the safety net: when the pool runs dry anyway (``kv_reserve`` < 1), the newest running
sequence is preempted, its blocks freed, and it goes back to the head of the waiting
queue to be recomputed (mostly from the prefix cache) later.

The scheduler only decides; ``KVCacheManager`` accounts; the runner computes.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Collection
from dataclasses import dataclass, field

from inhouse.engine.kv_cache import KVCacheManager
from inhouse.engine.outputs import SequenceOutput
from inhouse.engine.sampler import SampledToken
from inhouse.engine.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class SchedulerOutput:
    """What to run this step: ``(sequence, number of tokens)`` in batch order."""

    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    def sampling_rows(self) -> list[int]:
        """Rows whose sequence has caught up after this step, so it samples a token."""
        return [
            row
            for row, (seq, n) in enumerate(self.scheduled)
            if seq.num_computed_tokens + n == seq.num_tokens
        ]


class Scheduler:
    """Holds the waiting and running queues, picks each step's batch, applies its result."""

    def __init__(
        self,
        kv_cache: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        eos_token_ids: Collection[int] = (),
        kv_reserve: float = 1.0,
    ) -> None:
        self.kv_cache = kv_cache
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.kv_reserve = kv_reserve
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.finished_requests: Counter[str] = Counter()
        self._requests: dict[str, list[Sequence]] = {}

    def add(self, seqs: list[Sequence]) -> None:
        """Queue the sibling sequences of one request (index 0 leads the prompt)."""
        self._requests[seqs[0].request_id] = seqs
        self.waiting.extend(seqs)

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def sequences(self, request_id: str) -> list[Sequence]:
        """The request's sibling sequences (empty once all of them finished)."""
        return self._requests.get(request_id, [])

    # -- deciding ---------------------------------------------------------------------

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
        if not self.waiting:
            return
        skipped: list[Sequence] = []
        reserved = sum(self._blocks_to_finish(seq) for seq in self.running)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if self._waits_for_leader(seq):
                skipped.append(self.waiting.popleft())
                continue
            cached = self.kv_cache.find_cached_prefix(seq)
            revived = sum(1 for block in cached if block.ref_cnt == 0)
            need = self._blocks_to_finish(seq, len(cached)) + revived
            if self.running and self.kv_reserve * (reserved + need) > self.kv_cache.num_free_blocks:
                break
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
            reserved += self._blocks_to_finish(seq)
        self.waiting.extendleft(reversed(skipped))

    def _max_tokens_total(self, seq: Sequence) -> int:
        """Where the sequence stops for length: prompt + max_tokens, at most max_model_len."""
        max_tokens = seq.sampling_params.max_tokens or self.max_model_len
        return min(seq.num_prompt_tokens + max_tokens, self.max_model_len)

    def _blocks_to_finish(self, seq: Sequence, num_held: int | None = None) -> int:
        """Blocks the sequence must still take to reach its length limit (its last token
        is never computed); ``num_held`` defaults to its block table's length."""
        held = len(seq.block_table) if num_held is None else num_held
        final = self.kv_cache.blocks_for_tokens(self._max_tokens_total(seq) - 1)
        return max(final - held, 0)

    def _waits_for_leader(self, seq: Sequence) -> bool:
        """Siblings start after their leader computed the prompt, so they share its blocks."""
        if seq.index == 0:
            return False
        leader = self._requests[seq.request_id][0]
        return not leader.is_finished and leader.num_computed_tokens < leader.num_prompt_tokens

    def _preempt(self, seq: Sequence) -> None:
        self.kv_cache.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    # -- the step's aftermath ---------------------------------------------------------

    def update(
        self, out: SchedulerOutput, sampled: list[SampledToken | Exception]
    ) -> list[tuple[Sequence, SequenceOutput]]:
        """Apply a step: ``sampled`` holds, per row of ``out.sampling_rows()``, its token
        or the exception that sampling it raised. Returns each sampling sequence's news."""
        rows = out.sampling_rows()
        for seq, num_tokens in out.scheduled:
            seq.num_computed_tokens += num_tokens
            self.kv_cache.cache_computed_blocks(seq)
        news = []
        for row, token in zip(rows, sampled, strict=True):
            seq = out.scheduled[row][0]
            if seq.is_finished:  # a sibling failed earlier in this loop
                continue
            if isinstance(token, Exception):
                news.append((seq, self._fail(seq, token)))
                continue
            try:
                self._append(seq, token.token_id)
            except Exception as error:  # e.g. a grammar that rejects the token
                news.append((seq, self._fail(seq, error)))
                continue
            news.append(
                (
                    seq,
                    SequenceOutput(
                        seq.index,
                        token.token_id,
                        token.logprob,
                        token.top,
                        seq.finish_reason,
                        seq.stop_reason,
                    ),
                )
            )
        return news

    def _append(self, seq: Sequence, token_id: int) -> None:
        seq.token_ids.append(token_id)
        params = seq.sampling_params
        if seq.guide is not None:
            seq.guide.accept(token_id)
        may_stop = seq.num_output_tokens >= params.min_tokens
        if may_stop and not params.ignore_eos and token_id in self.eos_token_ids:
            self.finish(seq, "stop")
        elif may_stop and token_id in params.stop_token_ids:
            self.finish(seq, "stop", token_id)
        elif seq.guide is not None and seq.guide.is_terminated():
            self.finish(seq, "stop")
        elif seq.num_tokens >= self._max_tokens_total(seq):
            self.finish(seq, "length")

    def _fail(self, seq: Sequence, error: Exception) -> SequenceOutput:
        """Finish the sequence's whole request with "error"; the step goes on for the others."""
        self.finish_request(seq.request_id, "error")
        return SequenceOutput(
            seq.index, finish_reason="error", error=f"{type(error).__name__}: {error}"
        )

    def finish_request(self, request_id: str, reason: str) -> list[Sequence]:
        """Finish every unfinished sequence of the request; returns those it finished."""
        seqs = [seq for seq in self.sequences(request_id) if not seq.is_finished]
        for seq in seqs:
            self.finish(seq, reason)
        return seqs

    def finish(self, seq: Sequence, reason: str, stop_reason: int | str | None = None) -> None:
        """Mark a running or waiting sequence finished and return its blocks; a request
        whose sequences have all finished is forgotten and counted by its leader's reason."""
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
        siblings = self._requests[seq.request_id]
        if all(s.is_finished for s in siblings):
            del self._requests[seq.request_id]
            self.finished_requests[siblings[0].finish_reason or "abort"] += 1
