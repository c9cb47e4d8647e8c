"""Background rows under ``priority`` and ``fair``: while work of a better priority is
urgent (a candidate now, or within the last ``URGENT_HOLD_STEPS`` steps), worse work runs
in turns, the decodes that ran least recently first (of those the step's order holds):

- beside better work that prefills (or waits to), nothing: its first token's step is short;
- beside better work that decodes, at most the policy's background rows decodes (and
  prefill within the cap);
- between better requests (urgent, but none a candidate: a client sending its next
  request), ``GAP_ROWS`` decode and no prefill, since the next one will wait for that step.

A request that arrives mid-step waits for that step, and a CPU step's time grows with its
rows, so short steps where urgent work arrives bound interactive TTFT, while the steps
beside a decoding request (most of them) keep the batch's rate.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from inhouse.scheduling.candidate import Candidate

URGENT_HOLD_STEPS = 32  # a chat client's next request comes within a few steps of the last
GAP_ROWS = 1  # worse decodes a step runs between urgent requests (0 would spin empty steps)


class Urgency:
    """The best priority seen among the candidates of the last ``URGENT_HOLD_STEPS`` steps."""

    def __init__(self) -> None:
        self._seen: dict[int, int] = {}  # priority -> the last step it was a candidate

    def level(self, candidates: Iterable[Candidate], step: int) -> int | None:
        """Record this step's candidates; the best priority still held (None: none)."""
        for candidate in candidates:
            self._seen[candidate.priority] = step
        self._seen = {p: at for p, at in self._seen.items() if step - at <= URGENT_HOLD_STEPS}
        return min(self._seen, default=None)


@dataclass(frozen=True, slots=True)
class Background:
    """This step's work of a priority worse than ``above``: only the decodes in ``allowed``
    (by ``seq_id``), and prefill only if ``prefills``."""

    above: int
    allowed: frozenset[int]
    prefills: bool = True

    def holds_back(self, candidate: Candidate) -> bool:
        """Whether a worse candidate's decode (or, without ``prefills``, prefill) waits."""
        if candidate.priority <= self.above:
            return False
        if candidate.tokens_left == 1:
            return candidate.seq_id not in self.allowed
        return not self.prefills


def background_rows(order: list[Candidate], urgent: int | None, rows: int) -> Background | None:
    """Which worse-priority work a step runs, picked from the step's order (None:
    everything; so with no ``rows`` cap, nothing urgent, or few enough decodes): under
    fair a tenant that yields the step has none there, so its decodes never take a row
    the others could have used (the step would run empty)."""
    if not rows or urgent is None:
        return None
    urgent_here = [c for c in order if c.priority == urgent]
    if any(c.tokens_left > 1 for c in urgent_here):
        return Background(urgent, frozenset())  # better work prefills: a short step
    rows = rows if urgent_here else GAP_ROWS
    decodes = [c for c in order if c.priority > urgent and c.tokens_left == 1]
    if urgent_here and len(decodes) <= rows:
        return None
    decodes.sort(key=lambda c: c.last_step)  # the longest without a turn first (stable)
    allowed = frozenset(c.seq_id for c in decodes[:rows])
    return Background(urgent, allowed, prefills=bool(urgent_here))
