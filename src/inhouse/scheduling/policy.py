"""The policy a scheduler asks for each step's order (as vLLM v1's scheduler asks its
request queue): the candidates in the order they get the step's budget, and which worse
work waits. The budget, admission and preemption stay with the scheduler that asks.

- ``fcfs``: the candidates as given (running in admission order, then waiting ones in
  arrival order); priority and tenant are ignored.
- ``priority``: running and waiting candidates in one list by ``rank`` (priority, then
  arrival); lower priority numbers go first (vLLM's rule).
- ``fair``: ``priority``, and within a level tenants' fair shares (``fair_share``).

Under ``priority`` and ``fair``, worse work waits while better work is urgent
(``background``).
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import groupby

from inhouse.scheduling.background import Background, Urgency, background_rows
from inhouse.scheduling.candidate import C, Candidate, rank
from inhouse.scheduling.fair_share import TenantShares, interleave

POLICIES = ("fcfs", "priority", "fair")
# Prefill tokens one step gives under priority and fair when more than one sequence wants
# tokens. A request arriving mid-step waits for that step, so the cap bounds a step's
# length on a CPU, while staying above what a batch of long prompts needs a step to keep
# its rate (the measurements: docs/benchmarks.md, "Fair share and priority").
DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD = 128
# Under priority and fair, while better-priority work is active, the most decode rows of
# worse priority a step runs (a step's time is nearly linear in its rows on a CPU, so a
# short step is what bounds the wait of a request that arrives while it runs).
DEFAULT_BACKGROUND_DECODE_ROWS = 4


class SchedulingPolicy:
    """One scheduler's policy: the tenants' virtual times (``fair``), the urgency, and a
    cap of ``background_rows`` worse decodes (0: none) while better work is urgent."""

    def __init__(self, name: str = "fcfs", background_rows: int = 0) -> None:
        if name not in POLICIES:
            raise ValueError(f"the scheduling policy is one of {', '.join(POLICIES)}")
        self.name = name
        self.background_rows = background_rows
        self.shares = TenantShares() if name == "fair" else None
        self.urgency = Urgency()

    def arrive(self, tenant: str | None) -> None:
        """A request of ``tenant`` reached the scheduler."""
        if self.shares is not None:
            self.shares.activate(tenant)

    def finish(self, tenant: str | None) -> None:
        """A request of ``tenant`` finished (all of its sequences)."""
        if self.shares is not None:
            self.shares.release(tenant)

    def charge(self, scheduled: Iterable[tuple[Candidate, int]]) -> None:
        """A step scheduled these tokens (called once a step, an empty one too)."""
        if self.shares is not None:
            self.shares.charge(scheduled)

    def refund(self, scheduled: Iterable[tuple[Candidate, int]]) -> None:
        """A step stopped before its end: nothing it scheduled was computed."""
        if self.shares is not None:
            self.shares.refund(scheduled)

    def order(
        self, candidates: list[C], cap: int, seats_free: bool, step: int
    ) -> tuple[list[C], Background | None]:
        """Step ``step``'s candidates in the order they get budget, and the worse work that
        waits (None: none). ``cap`` is the most prefill tokens one candidate may take;
        ``seats_free`` whether a waiting candidate could start."""
        if self.name == "fcfs":
            return list(candidates), None

        def want(candidate: C) -> int:
            left = candidate.tokens_left
            return 1 if left == 1 else min(left, cap)

        ordered = sorted(candidates, key=rank)
        if self.shares is not None:
            levels = [list(level) for _, level in groupby(ordered, key=lambda c: c.priority)]
            ordered = [c for lv in levels for c in interleave(lv, want, self.shares, seats_free)]
        urgent = self.urgency.level(candidates, step) if self.background_rows else None
        return ordered, background_rows(ordered, urgent, self.background_rows)
