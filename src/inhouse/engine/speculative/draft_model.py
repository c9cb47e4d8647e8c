"""A draft model as the proposer: a smaller model with the target's tokenizer drafts greedily.

The draft model has its own runner and paged KV cache. Each target sequence that drafts
has a shadow sequence in it, holding the target's tokens and then the draft's. Before a
proposal the shadow keeps the K/V of the longest prefix it shares with the target (its
accepted draft tokens stay, rejected ones are released), catches up on the rest in one
batched forward, and then takes ``k`` greedy steps, all drafting sequences batched in
each. Greedy drafts are point masses, so the target's verification rule stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass

from inhouse.engine.errors import EngineConfigError
from inhouse.engine.kv_cache import KVCacheManager
from inhouse.engine.models.loader import LoadedModel
from inhouse.engine.runner import ModelRunner
from inhouse.engine.sampler import argmax_rows
from inhouse.engine.sequence import Sequence


@dataclass(slots=True)
class _Shadow:
    seq: Sequence  # the draft model's copy: target tokens, then its last draft
    synced: int  # how many of its tokens were the target's at the last proposal


def check_same_vocabulary(draft: LoadedModel, target: LoadedModel) -> None:
    """Refuse a draft model whose tokens do not mean what the target's mean."""
    sizes = int(draft.hf_config.vocab_size), int(target.hf_config.vocab_size)
    if sizes[0] != sizes[1] or draft.tokenizer.get_vocab() != target.tokenizer.get_vocab():
        raise EngineConfigError(
            f"the draft model {draft.model_id} has another vocabulary than the target "
            f"{target.model_id} ({sizes[0]} vs {sizes[1]} token ids, or other tokens): a draft "
            "model must share the target's tokenizer"
        )


class DraftModelProposer:
    """Greedy drafts from a small model, batched over the drafting sequences."""

    def __init__(self, draft: LoadedModel, num_blocks: int, block_size: int) -> None:
        self.runner = ModelRunner(draft, num_blocks, block_size)
        self.kv_cache = KVCacheManager(num_blocks, block_size, enable_prefix_caching=False)
        self._shadows: dict[int, _Shadow] = {}

    def forget(self, keep: set[int]) -> None:
        """Free the shadows of sequences not in ``keep`` (finished or not decoding)."""
        for seq_id in [s for s in self._shadows if s not in keep]:
            self.kv_cache.free(self._shadows.pop(seq_id).seq)

    def propose_batch(self, seqs: list[tuple[Sequence, int]]) -> list[list[int]]:
        """A greedy draft of ``k`` tokens for each ``(sequence, k)`` (empty where the draft
        model's cache has no room)."""
        active = [(self._sync(seq, k), seq, k) for seq, k in seqs]
        running = [(shadow, k) for shadow, _, k in active if shadow is not None]
        batch = [(s, s.num_tokens - s.num_computed_tokens) for s, _ in running]
        for step in range(max((k for _, k in running), default=0)):
            self._extend(batch)
            batch = [(s, 1) for s, k in running if k > step + 1]
        return [
            [] if shadow is None else shadow.token_ids[seq.num_tokens :]
            for shadow, seq, _ in active
        ]

    def _sync(self, seq: Sequence, k: int) -> Sequence | None:
        """The sequence's shadow, holding only K/V that match its tokens and room for ``k``
        draft tokens; None (and no shadow) when the cache cannot hold it."""
        if seq.num_tokens + k > self.runner.max_positions:
            return None
        state = self._shadows.get(seq.seq_id)
        if state is None:
            state = _Shadow(Sequence(seq.request_id, [], seq.sampling_params), 0)
            self._shadows[seq.seq_id] = state
        shadow, valid = state.seq, state.synced
        limit = min(shadow.num_computed_tokens, seq.num_tokens)
        while valid < limit and shadow.token_ids[valid] == seq.token_ids[valid]:
            valid += 1
        shadow.num_computed_tokens = min(valid, seq.num_tokens - 1)
        self.kv_cache.release_beyond(shadow, shadow.num_computed_tokens)
        shadow.token_ids = list(seq.token_ids)
        state.synced = seq.num_tokens
        if not self.kv_cache.allocate_slots(
            shadow, seq.num_tokens - shadow.num_computed_tokens + k - 1
        ):
            self.kv_cache.free(self._shadows.pop(seq.seq_id).seq)
            return None
        return shadow

    def _extend(self, batch: list[tuple[Sequence, int]]) -> None:
        """One forward of the draft model; each shadow takes its greedy next token."""
        logits = self.runner.execute(batch)
        for (shadow, n), token in zip(batch, argmax_rows(logits).tolist(), strict=True):
            shadow.num_computed_tokens += n
            shadow.token_ids.append(token)
