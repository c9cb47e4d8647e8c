"""Prompt lookup: draft the tokens that followed the last earlier occurrence of the
sequence's own ending.

For ``n`` from ``prompt_lookup_max`` down to ``prompt_lookup_min``, the last ``n`` tokens
are looked for earlier in prompt + output; the longest ``n`` that occurs wins, its most
recent occurrence is taken (edits and summaries quote the text nearest to where they
are), and up to ``k`` tokens that followed it are the draft. No occurrence: no draft.
With ``match_caps`` (``adaptive_length``) the draft is also at most ``n`` tokens long: a
longer match is better evidence that the text goes on as it did there, and a row that
verifies a rejected token costs ~0.22 of a plain step on a CPU
(``benchmarks/verify_step.py``), so a 1-gram's guess earns one row, an 8-gram's eight.
The search runs in C over the tokens as 4-byte words (``bytes.rfind``), so a
thousand-token context costs microseconds.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inhouse.engine.sequence import Sequence

_WORD = array("i").itemsize


class NgramProposer:
    """Drafts up to ``k`` tokens for a token list by matching its last n-gram."""

    def __init__(self, k: int, min_n: int, max_n: int, match_caps: bool = False) -> None:
        self.k = k
        self.min_n = min_n
        self.max_n = max_n
        self.match_caps = match_caps

    def forget(self, keep: set[int]) -> None:
        """Nothing to forget: prompt lookup reads each sequence's tokens afresh."""

    def propose_batch(self, seqs: list[tuple[Sequence, int]]) -> list[list[int]]:
        """A draft of at most ``k`` tokens for each ``(sequence, k)``."""
        return [self.propose(seq.token_ids, k) for seq, k in seqs]

    def propose(self, token_ids: list[int], k: int | None = None) -> list[int]:
        """The draft for ``token_ids`` (at most ``k`` tokens, default the proposer's)."""
        k = self.k if k is None else k
        found = self.match(token_ids) if k >= 1 else None
        if found is None:
            return []
        n, follow = found
        return token_ids[follow : follow + (min(k, n) if self.match_caps else k)]

    def match(self, token_ids: list[int]) -> tuple[int, int] | None:
        """The longest ``n`` whose last ``n`` tokens occurred earlier, and where the tokens
        after its most recent earlier occurrence start (None: no n-gram recurs)."""
        num_tokens = len(token_ids)
        if num_tokens <= self.min_n:
            return None
        words = array("i", token_ids).tobytes()
        for n in range(min(self.max_n, num_tokens - 1), self.min_n - 1, -1):
            start = _last_occurrence(words, words[-n * _WORD :], (num_tokens - 1) * _WORD)
            if start is not None:
                return n, start // _WORD + n
        return None


def _last_occurrence(words: bytes, pattern: bytes, end: int) -> int | None:
    """Byte offset of the last word-aligned ``pattern`` inside ``words[:end]``."""
    while True:
        at = words.rfind(pattern, 0, end)
        if at < 0:
            return None
        if at % _WORD == 0:
            return at
        end = at + len(pattern) - 1
