"""Tenants' shares under ``fair``: start-time fair queuing over tokens within a priority level.

- each tenant has a virtual time: the tokens computed for it (prefill, decode and draft
  tokens scheduled). A tenant back after more than ``FAIR_IDLE_GRACE_STEPS`` steps without
  a request (or new) comes back at no less than the smallest virtual time among the
  active tenants minus ``FAIR_QUANTUM_TOKENS`` (with none active, the last one seen), so
  idle time banks at most that much credit; one back sooner (a client sending its next
  request) keeps its virtual time, so the others do not gain what they ran in the gap.
  The share is thus measured over the recent past: what a tenant got beyond the quantum
  before it went idle for long no longer counts.
- candidates of one level are interleaved as weighted fair queuing orders packets: the
  next one is the next sequence (in arrival order) of the tenant whose finish tag, its
  virtual time plus the tokens projected for it this step up to and including that
  sequence, is smallest (a sequence is projected 1 token for a decode and
  ``min(left to compute, prefill cap)`` for a prefill), so a short request of a tenant at
  par goes before another's long chunk.
- a tenant yields the rest of the step once its projected virtual time (before its next
  sequence) passes ``bar + FAIR_QUANTUM_TOKENS``, ``bar`` being the smallest "virtual
  time plus everything it wants this step" over the level's tenants (only those that
  hold a seat while every seat is taken: a tenant that only waits for one cannot use its
  share): its running sequences are not scheduled this step (they keep their KV).

So tenants that stay backlogged at one level get equal tokens over time, whatever their
number of requests in flight: a tenant with 12 in flight beside one with 4 gets about 4
decode seats a step. Within a level this is not work-conserving (the seats the
over-served tenant leaves are idle; ``benchmarks/fair_share.py`` measures what that
costs); between levels it is. ``TenantShares`` holds the virtual times, ``interleave``
orders a level.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Callable, Iterable

from inhouse.scheduling.candidate import C, Candidate

# How far a tenant may run ahead of the least-served backlogged tenant of its level within
# a step, and how much credit a tenant back from idle keeps, in tokens: a few steps of
# decodes. The lag it allows is constant, so long-run shares are equal whatever it is;
# smaller keeps shares equal over shorter windows (a chunk already started is never split).
FAIR_QUANTUM_TOKENS = 64
# Steps a tenant may be idle and come back with its virtual time as it was: the gap between
# one request's end and the client's next (a round trip, a few steps) forgives nothing, or a
# tenant with one request in flight would let the others run free in every gap.
FAIR_IDLE_GRACE_STEPS = 32


class TenantShares:
    """Virtual time (tokens computed for it) of every tenant active or recently idle."""

    def __init__(self) -> None:
        self._vtime: dict[str | None, float] = {}
        self._unfinished: Counter[str | None] = Counter()
        self._idle_since: dict[str | None, int] = {}  # step a tenant went idle
        self._clock = 0.0  # the least active virtual time, as last seen
        self._steps = 0

    def activate(self, tenant: str | None) -> None:
        """A request of ``tenant`` arrived. A tenant idle for more than
        ``FAIR_IDLE_GRACE_STEPS`` (or new) comes back at no less than the least active
        virtual time minus ``FAIR_QUANTUM_TOKENS``: at most that much credit is kept."""
        if not self._unfinished[tenant]:
            idle_since = self._idle_since.pop(tenant, None)
            self._clock = min((self._vtime[t] for t in self._unfinished), default=self._clock)
            if idle_since is None or self._steps - idle_since > FAIR_IDLE_GRACE_STEPS:
                floor = self._clock - FAIR_QUANTUM_TOKENS
                self._vtime[tenant] = max(self._vtime.get(tenant, floor), floor)
            self._forget_long_idle()
        self._unfinished[tenant] += 1

    def _forget_long_idle(self) -> None:
        """Drop tenants idle past the grace at or below the floor: they would come back there."""
        floor = self._clock - FAIR_QUANTUM_TOKENS
        for tenant, since in list(self._idle_since.items()):
            if self._steps - since > FAIR_IDLE_GRACE_STEPS and self._vtime[tenant] <= floor:
                del self._idle_since[tenant], self._vtime[tenant]

    def release(self, tenant: str | None) -> None:
        """A request of ``tenant`` finished; a tenant with none left is idle."""
        self._unfinished[tenant] -= 1
        if self._unfinished[tenant] <= 0:
            del self._unfinished[tenant]
            self._idle_since[tenant] = self._steps

    def charge(self, scheduled: Iterable[tuple[Candidate, int]]) -> None:
        """Add a step's scheduled tokens to their tenants' virtual times."""
        self._steps += 1
        for candidate, num_tokens in scheduled:
            self._vtime[candidate.tenant] += num_tokens

    def refund(self, scheduled: Iterable[tuple[Candidate, int]]) -> None:
        """Take back a step's charge: it was abandoned, nothing was computed."""
        for candidate, num_tokens in scheduled:
            if candidate.tenant in self._vtime:
                self._vtime[candidate.tenant] -= num_tokens

    def vtime(self, tenant: str | None) -> float:
        """The tenant's virtual time (0 for a tenant that is not active)."""
        return self._vtime.get(tenant, 0.0)


def interleave(
    level: list[C], want: Callable[[C], int], shares: TenantShares, seats_free: bool
) -> list[C]:
    """One priority level's candidates (in rank order) interleaved by tenant, without those
    of tenants that yield the step (see the module docstring); ``want`` is what a candidate
    would take this step, ``seats_free`` whether a waiting one could start."""
    queues: dict[str | None, deque[C]] = {}
    for candidate in level:
        queues.setdefault(candidate.tenant, deque()).append(candidate)
    # With every seat taken, the bar is set by tenants that hold one: a tenant that only
    # waits could not use its share, and would hold every other tenant still.
    setters = list(queues)
    if not seats_free:
        setters = [t for t in setters if any(c.running for c in queues[t])] or setters
    bar = min(shares.vtime(t) + sum(map(want, queues[t])) for t in setters)
    limit = bar + FAIR_QUANTUM_TOKENS
    # (finish tag: projected virtual time after its next sequence, rank, tenant, projected)
    heap = []
    for rank, (tenant, queue) in enumerate(queues.items()):
        start = shares.vtime(tenant)
        heap.append((start + want(queue[0]), rank, tenant, start))
    heapq.heapify(heap)
    result = []
    while heap:
        finish, rank, tenant, start = heapq.heappop(heap)
        if start > limit:
            continue  # this tenant yields the rest of the step
        result.append(queues[tenant].popleft())
        if queues[tenant]:
            heapq.heappush(heap, (finish + want(queues[tenant][0]), rank, tenant, finish))
    return result
