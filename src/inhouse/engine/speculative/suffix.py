"""Suffix decoding (vLLM's ``suffix`` method): a draft from the request's own text or from
earlier requests' outputs, whichever matches the sequence's ending longer.

The request's prompt and output are searched as prompt lookup searches them
(:mod:`~inhouse.engine.speculative.ngram`: n-grams of 2 up to the tree depth, the most
recent occurrence), earlier outputs in the :class:`OutputHistory` the ``Drafter`` fills as
requests finish. The longer match drafts (the request's own on a tie), at most
``suffix_decoding_max_spec_factor`` times its length. A request drafts only from
outputs of requests with its ``cache_salt`` (the gateway's per-key salt; none: those
without one), as the prefix cache shares blocks: how fast it is answered would otherwise
tell what other users were answered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inhouse.engine.speculative.history import OutputHistory
from inhouse.engine.speculative.ngram import NgramProposer

if TYPE_CHECKING:
    from inhouse.engine.sequence import Sequence

OWN_MIN_N = 2


class SuffixProposer:
    """Drafts from a sequence's own tokens or the shared output history."""

    def __init__(self, k: int, max_depth: int, factor: float, history: OutputHistory) -> None:
        self.own = NgramProposer(k, OWN_MIN_N, max_depth)
        self.factor = factor
        self.history = history

    def forget(self, keep: set[int]) -> None:
        """Nothing per sequence to forget: the history keeps outputs, not sequences."""

    def propose_batch(self, seqs: list[tuple[Sequence, int]]) -> list[list[int]]:
        """A draft of at most ``k`` tokens for each ``(sequence, k)``."""
        return [self.propose(seq, k) for seq, k in seqs]

    def propose(self, seq: Sequence, k: int) -> list[int]:
        tokens = seq.token_ids
        found = self.own.match(tokens)
        n = 0 if found is None else found[0]
        _, draft = self.history.draft(tokens, k, longer_than=n, salt=seq.cache_salt)
        if draft:
            return draft
        if found is None:
            return []
        return tokens[found[1] : found[1] + min(k, int(self.factor * n))]
