"""What one step runs: the batch ``Scheduler`` picked, the sequences it preempted, the drafts."""

from __future__ import annotations

from dataclasses import dataclass, field

from inhouse.engine.sequence import Sequence


@dataclass(slots=True)
class SchedulerOutput:
    """What to run this step: ``(sequence, number of tokens)`` in batch order.

    ``drafts`` maps a row to the draft tokens scheduled after its sequence's last token
    (they are counted in the row's number of tokens); the runner gives such a row one
    logits row per draft token more.
    """

    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    drafts: dict[int, list[int]] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    def sampling_rows(self) -> list[int]:
        """Rows whose sequence has caught up after this step, so it samples a token."""
        return [
            row
            for row, (seq, n) in enumerate(self.scheduled)
            if seq.num_computed_tokens + n - len(self.drafts.get(row, ())) == seq.num_tokens
        ]

    def logit_offsets(self) -> list[int]:
        """Each row's first logits row: rows with a draft have ``1 + len(draft)``."""
        offsets, at = [], 0
        for row in range(len(self.scheduled)):
            offsets.append(at)
            at += 1 + len(self.drafts.get(row, ()))
        return offsets
