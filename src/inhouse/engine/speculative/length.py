"""How long a draft model's next draft may be, when the draft length adapts (ours;
prompt lookup's drafts follow the length of their match instead, see ``ngram``).

A verify step pays a row for every drafted token, accepted or not, and gains only the
accepted ones. Drafts come in two kinds: inside a passage the answer copies (an edit, a
quote, a summary that keeps the text's words) whole drafts are accepted, elsewhere the
first or second token is usually rejected. So each sequence's
length starts at ``most`` (``num_speculative_tokens``); a draft accepted whole doubles it
(up to ``most``), a rejected one sets it to one more than what was accepted (at least 1).
Outputs do not change: only how many tokens are proposed, never which.
"""

from __future__ import annotations


class DraftLength:
    """The per-sequence draft length, from how the sequence's previous draft fared."""

    def __init__(self, most: int) -> None:
        self.most = most
        self._length: dict[int, int] = {}

    def of(self, seq_id: int) -> int:
        """The longest draft the sequence may propose at its next step."""
        return self._length.get(seq_id, self.most)

    def record(self, seq_id: int, num_drafted: int, num_accepted: int) -> None:
        """One verified draft of the sequence."""
        if num_accepted >= num_drafted:
            self._length[seq_id] = min(self.most, 2 * max(num_drafted, 1))
        else:
            self._length[seq_id] = num_accepted + 1

    def forget(self, keep: set[int]) -> None:
        """Drop the lengths of sequences not in ``keep`` (finished ones)."""
        for seq_id in [s for s in self._length if s not in keep]:
            del self._length[seq_id]
