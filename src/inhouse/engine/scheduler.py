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

Speculative decoding: a decoding sequence with a draft is scheduled for its last token
plus the draft, and ``update`` verifies the draft position by position (see
:meth:`Scheduler.update`); rejected tokens' blocks go back to the pool, and a block is
hashed for the prefix cache only once every token in it was accepted.

Under ``--scheduling-policy priority`` or ``fair`` the batch is built by
``class_step.schedule_by_class`` instead, in the order ``inhouse.scheduling`` gives (by
priority, tenants' fair shares), under a shared prefill cap (see there); fcfs is the order
described above. Preemptions are counted by
cause: "kv" (the pool ran dry) and "priority" (yielded to a better priority).

The scheduler only decides; ``KVCacheManager`` accounts; the runner computes.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Mapping

from inhouse.engine.class_step import schedule_by_class
from inhouse.engine.kv_cache import KVCacheManager
from inhouse.engine.outputs import SequenceOutput
from inhouse.engine.sampler import SampledToken
from inhouse.engine.scheduler_output import SchedulerOutput
from inhouse.engine.sequence import Sequence, SequenceStatus
from inhouse.engine.speculative.drafter import Verified
from inhouse.engine.speculative.verify_rows import RoundTokens, SampleRows
from inhouse.scheduling.policy import SchedulingPolicy


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
        policy: str = "fcfs",
        prefill_cap: int | None = None,
        background_rows: int = 0,
    ) -> None:
        self.kv_cache = kv_cache
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.kv_reserve = kv_reserve
        self.policy = SchedulingPolicy(policy, background_rows)
        self.prefill_cap = prefill_cap or max_num_batched_tokens
        self.steps = 0
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions: Counter[str] = Counter()  # by cause: "kv" or "priority"
        self.finished_requests: Counter[str] = Counter()
        self._requests: dict[str, list[Sequence]] = {}

    @property
    def num_preemptions(self) -> int:
        return sum(self.preemptions.values())

    def add(self, seqs: list[Sequence]) -> None:
        """Queue the sibling sequences of one request (index 0 leads the prompt)."""
        self._requests[seqs[0].request_id] = seqs
        self.waiting.extend(seqs)
        self.policy.arrive(seqs[0].tenant)

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    def sequences(self, request_id: str) -> list[Sequence]:
        """The request's sibling sequences (empty once all of them finished)."""
        return self._requests.get(request_id, [])

    # -- deciding ---------------------------------------------------------------------

    def decoding(self) -> list[tuple[Sequence, int]]:
        """Running sequences with one token left to compute, each with the most draft
        tokens that still fit before its length limit (a bonus token always follows)."""
        return [
            (seq, self._max_tokens_total(seq) - seq.num_tokens - 1)
            for seq in self.running
            if seq.num_tokens - seq.num_computed_tokens == 1
        ]

    def schedule(self, drafts: Mapping[int, list[int]] | None = None) -> SchedulerOutput:
        """The step's batch; ``drafts`` (by ``seq_id``) are scheduled after decoding
        sequences' last token where the budget and the free blocks allow."""
        out = SchedulerOutput()
        self.steps += 1
        if self.policy.name != "fcfs":
            schedule_by_class(self, out, drafts or {})
            return out
        budget = self._schedule_running(out, self.max_num_batched_tokens, drafts or {})
        if not out.preempted:
            self._schedule_waiting(out, budget)
        return out

    def _schedule_running(
        self, out: SchedulerOutput, budget: int, drafts: Mapping[int, list[int]]
    ) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if num_new <= 0:
                i += 1
                continue
            used = self.place_running(out, seq, num_new, budget, drafts, self._newest)
            budget -= used
            i += 1 if used else 0  # 0: the sequence preempted itself, the last one
        return budget

    def place_running(
        self,
        out: SchedulerOutput,
        seq: Sequence,
        num_new: int,
        budget: int,
        drafts: Mapping[int, list[int]],
        victim: Callable[[], Sequence],
    ) -> int:
        """Schedule ``num_new`` tokens (a decode's draft too, where it fits) of a running
        sequence; tokens scheduled. Out of blocks, ``victim()`` is preempted until they
        fit: 0 when that was the sequence itself."""
        draft = drafts.get(seq.seq_id, [])[: budget - 1] if num_new == 1 else []
        if draft and self.kv_cache.allocate_slots(seq, 1 + len(draft)):
            out.drafts[len(out.scheduled)] = draft
            out.scheduled.append((seq, 1 + len(draft)))
            return 1 + len(draft)
        while not self.kv_cache.allocate_slots(seq, num_new):
            preempted = victim()
            self.preempt(out, preempted, "kv")
            if preempted is seq:
                return 0
        out.scheduled.append((seq, num_new))
        return num_new

    def _newest(self) -> Sequence:
        return self.running[-1]

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        if not self.waiting:
            return
        skipped: list[Sequence] = []
        reserved = self.reserved_blocks()
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if self.waits_for_leader(seq):
                skipped.append(self.waiting.popleft())
                continue
            num_new = self.admit(out, seq, budget, reserved)
            if not num_new:
                break
            budget -= num_new
            reserved += self.blocks_to_finish(seq)
        self.waiting.extendleft(reversed(skipped))

    def reserved_blocks(self) -> int:
        """Blocks the running sequences still need to reach their length limits."""
        return sum(self.blocks_to_finish(seq) for seq in self.running)

    def admit(self, out: SchedulerOutput, seq: Sequence, limit: int, reserved: int) -> int:
        """Start a waiting sequence with at most ``limit`` tokens after its cached prefix,
        if the free blocks cover ``kv_reserve`` times ``reserved`` plus what it needs;
        tokens scheduled (0: not admitted)."""
        cached = self.kv_cache.find_cached_prefix(seq)
        revived = sum(1 for block in cached if block.ref_cnt == 0)
        need = self.blocks_to_finish(seq, len(cached)) + revived
        if self.running and self.kv_reserve * (reserved + need) > self.kv_cache.num_free_blocks:
            return 0
        num_cached = len(cached) * self.kv_cache.block_size
        num_new = min(seq.num_tokens - num_cached, limit)
        if not self.kv_cache.allocate_slots(seq, num_new, cached):
            return 0
        self.waiting.remove(seq)
        self.kv_cache.record_lookup(seq.num_tokens, num_cached)
        seq.num_computed_tokens = num_cached
        if seq.first_scheduled_time is None:
            seq.num_cached_tokens = num_cached
            seq.first_scheduled_time = time.monotonic()
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        out.scheduled.append((seq, num_new))
        return num_new

    def _max_tokens_total(self, seq: Sequence) -> int:
        """Where the sequence stops for length: prompt + max_tokens, at most max_model_len."""
        max_tokens = seq.sampling_params.max_tokens or self.max_model_len
        return min(seq.num_prompt_tokens + max_tokens, self.max_model_len)

    def blocks_to_finish(self, seq: Sequence, num_held: int | None = None) -> int:
        """Blocks the sequence must still take to reach its length limit (its last token
        is never computed); ``num_held`` defaults to its block table's length."""
        held = len(seq.block_table) if num_held is None else num_held
        final = self.kv_cache.blocks_for_tokens(self._max_tokens_total(seq) - 1)
        return max(final - held, 0)

    def waits_for_leader(self, seq: Sequence) -> bool:
        """Siblings start after their leader computed the prompt, so they share its blocks."""
        if seq.index == 0:
            return False
        leader = self._requests[seq.request_id][0]
        return not leader.is_finished and leader.num_computed_tokens < leader.num_prompt_tokens

    def preempt(self, out: SchedulerOutput, seq: Sequence, cause: str) -> None:
        """Take a running sequence out: free its blocks (full ones stay in the prefix cache),
        requeue it first, count it by ``cause``."""
        self.running.remove(seq)
        self.kv_cache.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        self.preemptions[cause] += 1

    def abandon(self, out: SchedulerOutput) -> None:
        """Undo what a step stopped before its end took: its tenants' charges and its
        drafts' slots (admissions and preemptions stand; nothing was computed)."""
        self.policy.refund(out.scheduled)
        for row in out.drafts:
            seq = out.scheduled[row][0]
            self.kv_cache.release_beyond(seq, seq.num_tokens)

    # -- the step's aftermath ---------------------------------------------------------

    def update(
        self, out: SchedulerOutput, sample: SampleRows
    ) -> tuple[list[tuple[Sequence, SequenceOutput]], list[Verified]]:
        """Apply a step: ``sample(logit_rows, seqs)`` gives each listed logits row's token
        (or the exception sampling it raised). Returns the news of every sampling sequence
        (one entry per token it gained) and how each draft fared.

        Verification runs in rounds: round ``j`` samples, for every sequence still in
        play, the logits row after its ``j``-th draft token, with the sequence's state
        (penalties, min_tokens, grammar) as of the tokens accepted so far, and appends
        the token. A sequence stays in play while its sampled token equals its draft's
        next one (that draft token's K/V is then final). So greedy outputs equal those
        without drafts, and under sampling a draft token ``d`` is kept with probability
        ``p(d)`` and otherwise replaced by a draw from ``p`` without ``d``: the standard
        rejection rule (accept with ``min(1, p/q)``, else draw from ``max(0, p - q)``)
        for a point-mass draft ``q``, which prompt lookup and greedy drafters give.
        A draft whose choice has no state (greedy, no penalties or grammar) has all its
        rows sampled in the first round (``RoundTokens``): the same tokens, one call.
        """
        round_tokens = RoundTokens(
            sample, out.logit_offsets(), out.drafts, lambda row: out.scheduled[row][0]
        )
        in_play = [(row, 0) for row in out.sampling_rows()]
        for row, (seq, num_tokens) in enumerate(out.scheduled):
            seq.num_computed_tokens += num_tokens - len(out.drafts.get(row, ()))
            self.kv_cache.cache_computed_blocks(seq)
        news: list[tuple[Sequence, SequenceOutput]] = []
        verified: list[Verified] = []
        while in_play:
            seqs = [out.scheduled[row][0] for row, _ in in_play]
            tokens = round_tokens(in_play)
            still = []
            for (row, j), seq, token in zip(in_play, seqs, tokens, strict=True):
                taken = self._take(seq, token)
                news += taken
                draft = out.drafts.get(row)
                if draft is None:
                    continue
                matched = bool(taken) and j < len(draft) and taken[0][1].token_id == draft[j]
                if matched and not seq.is_finished:
                    seq.num_computed_tokens += 1
                    self.kv_cache.cache_computed_blocks(seq)
                    still.append((row, j + 1))
                    continue
                verified.append(Verified(seq, len(draft), j + matched))
                if not seq.is_finished:
                    self.kv_cache.release_beyond(seq, seq.num_computed_tokens)
            in_play = still
        return news, verified

    def _take(
        self, seq: Sequence, token: SampledToken | Exception
    ) -> list[tuple[Sequence, SequenceOutput]]:
        """Append a sampled token (or fail on its exception); the sequence's news."""
        if seq.is_finished:  # a sibling failed earlier in this step
            return []
        if isinstance(token, Exception):
            return [(seq, self._fail(seq, token))]
        try:
            self._append(seq, token.token_id)
        except Exception as error:  # e.g. a grammar that rejects the token
            return [(seq, self._fail(seq, error))]
        output = SequenceOutput(
            seq.index, token.token_id, token.logprob, token.top, seq.finish_reason, seq.stop_reason
        )
        return [(seq, output)]

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
            self.policy.finish(seq.tenant)
