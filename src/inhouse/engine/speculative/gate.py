"""The adaptive off-switch: a sequence whose drafts keep being rejected stops drafting a while.

Verifying ``k`` drafted tokens costs ``k`` more rows in the step; on a CPU one user's
decode is bound by streaming the weights, so the rows are nearly free, but a full batch
pays for each. The gate keeps, per sequence, its last ``window`` drafts' drafted and
accepted counts; once the window is full and its acceptance rate is below ``threshold``,
the sequence sits out ``pause`` steps and then starts a fresh window.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Record:
    recent: deque[tuple[int, int]] = field(default_factory=deque)
    paused_until: int = 0


class AcceptanceGate:
    """Says whether a sequence may draft at a step, from how its drafts fared."""

    def __init__(self, threshold: float, window: int, pause: int) -> None:
        self.threshold = threshold
        self.window = window
        self.pause = pause
        self._records: dict[int, _Record] = {}
        self.num_pauses = 0

    def allows(self, seq_id: int, step: int) -> bool:
        record = self._records.get(seq_id)
        return record is None or step >= record.paused_until

    def record(self, seq_id: int, step: int, num_drafted: int, num_accepted: int) -> None:
        """One verified draft of the sequence; may pause it from the next step on."""
        record = self._records.setdefault(seq_id, _Record())
        record.recent.append((num_drafted, num_accepted))
        if len(record.recent) < self.window:
            return
        drafted = sum(d for d, _ in record.recent)
        accepted = sum(a for _, a in record.recent)
        record.recent.popleft()
        if accepted < self.threshold * drafted:
            record.paused_until = step + 1 + self.pause
            record.recent.clear()
            self.num_pauses += 1

    def forget(self, keep: set[int]) -> None:
        """Drop the records of sequences not in ``keep`` (finished ones)."""
        for seq_id in [s for s in self._records if s not in keep]:
            del self._records[seq_id]
