"""What the policy reads of a sequence: the engine's ``Sequence`` and the plan's
``SimRequest`` both answer it."""

from __future__ import annotations

from typing import Protocol, TypeVar


class Candidate(Protocol):
    """A running or waiting sequence as a step's order sees it."""

    @property
    def priority(self) -> int:
        """Lower is served earlier (vLLM's rule)."""

    @property
    def arrival(self) -> float:
        """When it reached the scheduler; a larger one arrived later."""

    @property
    def tenant(self) -> str | None:
        """Whose share it draws on (the request's cache salt; None: the anonymous tenant)."""

    @property
    def tokens_left(self) -> int:
        """Tokens not yet computed (a waiting sequence: its whole length); 1 is a decode."""

    @property
    def running(self) -> bool:
        """Whether it holds a seat (and KV blocks)."""

    @property
    def last_step(self) -> int:
        """The step that last gave it tokens."""

    @property
    def seq_id(self) -> int:
        """Unique among the candidates; the last tie-break."""


C = TypeVar("C", bound=Candidate)


def rank(candidate: Candidate) -> tuple[int, float, int]:
    """Order under priority and fair: priority, then arrival, then id (siblings of one
    request share an arrival). The largest is the worst: preemption's victim."""
    return (candidate.priority, candidate.arrival, candidate.seq_id)
