"""The drafter beside the runner: which decoding sequences draft this step, and what.

Each step, before scheduling, every running sequence that is decoding (one token left
to compute) and that the :class:`AcceptanceGate` lets through gets a draft from the
proposer (prompt lookup or a draft model), at most as long as its room before
``max_tokens``. The scheduler schedules the draft beside the last token and verifies it
in ``Scheduler.update``; what was accepted comes back to :meth:`Drafter.record` for the
gate and the metrics (vLLM's ``spec_decode_*`` counters). With an output ``history``
(suffix decoding) the drafter also hands it the output of every decoding sequence that
finishes, drafting or not, under the sequence's ``cache_salt``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol

from inhouse.engine.sequence import Sequence
from inhouse.engine.speculative.config import SpeculativeConfig
from inhouse.engine.speculative.gate import AcceptanceGate
from inhouse.engine.speculative.history import OutputHistory
from inhouse.engine.speculative.length import DraftLength


class Proposer(Protocol):
    """Makes drafts: one token list per sequence, each at most its ``k`` long."""

    def propose_batch(self, seqs: list[tuple[Sequence, int]]) -> list[list[int]]: ...

    def forget(self, keep: set[int]) -> None:
        """Drop any state kept for sequences whose ``seq_id`` is not in ``keep``."""


@dataclass(slots=True)
class SpecDecodeCounters:
    """vLLM's ``spec_decode`` counters: drafts verified, tokens drafted and accepted, and
    accepted tokens by position in the draft."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    num_pauses: int = 0

    def snapshot(self) -> SpecDecodeCounters:
        """A copy that later steps do not change."""
        return replace(self, num_accepted_tokens_per_pos=list(self.num_accepted_tokens_per_pos))


@dataclass(slots=True, frozen=True)
class Verified:
    """One sequence's draft after verification: how long it was, how much was accepted."""

    seq: Sequence
    num_drafted: int
    num_accepted: int


class Drafter:
    """Picks the sequences that draft, asks the proposer, learns from the verification."""

    def __init__(
        self,
        config: SpeculativeConfig,
        proposer: Proposer,
        length: DraftLength | None = None,
        history: OutputHistory | None = None,
    ) -> None:
        self.config = config
        self.proposer = proposer
        self.history = history
        self._decoding: dict[int, Sequence] = {}  # seen decoding; their outputs go to history
        self.gate = AcceptanceGate(
            config.min_acceptance_rate, config.acceptance_window, config.pause_steps
        )
        self.length = length  # None: drafts as long as the proposer makes them
        self.counters = SpecDecodeCounters(
            num_accepted_tokens_per_pos=[0] * config.num_speculative_tokens
        )

    def propose(self, decoding: list[tuple[Sequence, int]], step: int) -> dict[int, list[int]]:
        """Drafts by ``seq_id`` for the decoding sequences ``(seq, room)`` the gate allows
        (none while more than ``disable_by_batch_size`` decode); ``room`` caps a draft
        (tokens left before the length limit, less the bonus one)."""
        if self.history is not None:
            for seq, _ in decoding:
                self._decoding[seq.seq_id] = seq
        limit = self.config.disable_by_batch_size
        if limit is not None and len(decoding) > limit:
            return {}
        k = self.config.num_speculative_tokens
        gate, length = self.gate, self.length
        asked = [
            (seq, min(k if length is None else length.of(seq.seq_id), room))
            for seq, room in decoding
            if room > 0 and gate.allows(seq.seq_id, step)
        ]
        if not asked:
            return {}
        drafts = self.proposer.propose_batch(asked)
        return {seq.seq_id: draft for (seq, _), draft in zip(asked, drafts, strict=True) if draft}

    def keep_only(self, running: list[Sequence]) -> None:
        """Forget the gate records and proposer state of sequences no longer running; the
        finished ones' outputs go to the history."""
        keep = {seq.seq_id for seq in running}
        if self.history is not None:
            for seq_id in [s for s in self._decoding if s not in keep]:
                seq = self._decoding.pop(seq_id)
                if seq.is_finished:
                    self.history.add(seq.output_token_ids, seq.cache_salt)
        self.gate.forget(keep)
        self.proposer.forget(keep)
        if self.length is not None:
            self.length.forget(keep)

    def record(self, verified: list[Verified], step: int) -> None:
        """Count the step's verified drafts and tell the gate how each fared."""
        counters = self.counters
        for item in verified:
            counters.num_drafts += 1
            counters.num_draft_tokens += item.num_drafted
            counters.num_accepted_tokens += item.num_accepted
            for pos in range(item.num_accepted):
                counters.num_accepted_tokens_per_pos[pos] += 1
            self.gate.record(item.seq.seq_id, step, item.num_drafted, item.num_accepted)
            if self.length is not None:
                self.length.record(item.seq.seq_id, item.num_drafted, item.num_accepted)
        counters.num_pauses = self.gate.num_pauses
