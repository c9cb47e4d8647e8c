"""One request as the scheduler simulation tracks it: lengths, progress, class and tags."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

_ids = itertools.count()


@dataclass(slots=True, eq=False)
class SimRequest:
    """A request inside the simulated engine; times are simulated seconds.

    ``arrival`` numbers requests in the order they reached the engine (the tie-break of
    every policy); ``klass`` is the index of the workload that sent it. It is a
    ``inhouse.scheduling.candidate.Candidate``, as the engine's ``Sequence`` is.
    """

    prompt: int
    output: int
    sent: float
    klass: int = 0
    priority: int = 0
    tenant: str = ""
    arrival: int = 0
    computed: int = 0
    generated: int = 0
    running: bool = False
    first_token: float | None = None
    last_token: float | None = None
    advanced: int = 0  # tokens the last step that sampled gave it
    credit: float = 0.0  # speculation's fractional tokens carried to the next step
    last_step: int = 0  # the step that last gave it tokens (background rows' turns)
    seq_id: int = field(default_factory=lambda: next(_ids))

    def speculate(self, mean_accepted_length: float) -> int:
        """Whole tokens a verified step yields: the credit so far plus the mean accepted
        length, capped at what is left to generate (at least 1)."""
        self.credit += mean_accepted_length
        whole = max(1, min(math.floor(self.credit), self.output - self.generated))
        self.credit -= whole
        return whole

    @property
    def uncomputed(self) -> int:
        """Tokens not yet computed; every sampled token is fed back once in the next step."""
        return self.prompt + self.generated - self.computed

    @property
    def tokens_left(self) -> int:
        """Tokens left as the engine's scheduler counts them: a waiting sequence (new or
        preempted) shows its whole length until admission finds its cached prefix."""
        return self.uncomputed if self.running else self.prompt + self.generated

    @property
    def decoding(self) -> bool:
        """Whether the request runs with one token left to compute (its last sampled one,
        or its prompt's last), which the engine schedules as a decode."""
        return self.running and self.uncomputed == 1

    @property
    def finished(self) -> bool:
        return self.generated >= self.output

    def blocks_to_finish(self, block_size: int) -> int:
        """KV blocks the request holds once it reaches its length (its last token is never
        computed)."""
        return math.ceil((self.prompt + self.output - 1) / block_size)
