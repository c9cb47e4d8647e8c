"""The engine's scheduling policies (`inhouse serve --scheduling-policy`), as the simulation
walks them: the order in which a step offers its token budget to sequences.

- ``fcfs``: running sequences in admission order, then waiting ones in arrival order;
  priority and tenant are ignored.
- ``priority``: running and waiting sequences in one list by (priority, arrival); lower
  priority numbers go first (vLLM's rule).
- ``fair``: ``priority``, and within one priority level start-time fair queuing between
  tenants: each tenant has a virtual time (tokens computed for it; one back from more than
  a short idle keeps at most a quantum of credit below the least active one), the level's
  sequences are interleaved by the tenant with the least virtual time plus what it is
  offered this step, and a tenant is skipped for the rest of the step once that passes the
  level's least (virtual time + everything it wants) by more than `FAIR_QUANTUM` tokens.
  Backlogged tenants of one level thus get equal tokens whatever their requests in flight.

The rules on prefill (a step's prefill tokens capped at the long-prefill threshold, a worse
priority getting none once a better one got some), on background rows (`Urgency`,
`background_rows`) and on preemption live in the step itself (`inhouse.plan.sim_engine`),
as in the engine (`inhouse.engine.class_step`).
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import groupby

from inhouse.plan.errors import PlanError
from inhouse.plan.sim_request import SimRequest

POLICIES = ("fcfs", "priority", "fair")
Want = Callable[[SimRequest], int]
DEFAULT_LONG_PREFILL_THRESHOLD = 128  # the engine's default under priority and fair
DEFAULT_BACKGROUND_DECODE_ROWS = 4  # the engine's default under priority and fair
URGENT_HOLD_STEPS = 32  # steps a priority stays urgent after it was last a candidate
GAP_ROWS = 1  # worse decodes a step runs while the urgent level has no candidate
FAIR_QUANTUM = 64  # tokens a tenant may lead the level's least within a step; credit kept
FAIR_IDLE_GRACE_STEPS = 32  # steps a tenant may be idle and keep its virtual time


def check_policy(policy: str) -> str:
    """The policy's name, or a PlanError listing the known ones."""
    if policy not in POLICIES:
        raise PlanError(f"the scheduling policy is one of {', '.join(POLICIES)}, not {policy!r}")
    return policy


@dataclass(slots=True)
class FairShare:
    """Each tenant's virtual time (tokens computed for it). A tenant back after more than
    `FAIR_IDLE_GRACE_STEPS` steps without a request (or new) comes back at no less than
    the least active virtual time less `FAIR_QUANTUM` (with none active, the least seen
    last), so idle time banks at most a quantum of credit; one back sooner (a client
    sending its next request) keeps its virtual time."""

    vtime: dict[str, int] = field(default_factory=dict)
    unfinished: Counter[str] = field(default_factory=Counter)
    idle_since: dict[str, int] = field(default_factory=dict)
    clock: int = 0
    steps: int = 0

    def arrive(self, tenant: str) -> None:
        """A request of `tenant` reached the engine."""
        if not self.unfinished[tenant]:
            since = self.idle_since.pop(tenant, None)
            self.clock = min((self.vtime[t] for t in self.unfinished), default=self.clock)
            floor = self.clock - FAIR_QUANTUM
            if since is None or self.steps - since > FAIR_IDLE_GRACE_STEPS:
                self.vtime[tenant] = max(self.vtime.get(tenant, floor), floor)
            for idle, idled in list(self.idle_since.items()):
                if self.steps - idled > FAIR_IDLE_GRACE_STEPS and self.vtime[idle] <= floor:
                    del self.idle_since[idle], self.vtime[idle]  # it would come back there
        self.unfinished[tenant] += 1

    def finish(self, tenant: str) -> None:
        """A request of `tenant` finished; a tenant with none left is idle from now."""
        self.unfinished[tenant] -= 1
        if self.unfinished[tenant] <= 0:
            del self.unfinished[tenant]
            self.idle_since[tenant] = self.steps

    def charge(self, batch: Iterable[tuple[SimRequest, int]]) -> None:
        """A step computed these tokens for these requests' tenants."""
        self.steps += 1
        for request, tokens in batch:
            self.vtime[request.tenant] += tokens

    def interleave(
        self, level: list[SimRequest], want: Want, seats_free: bool = True
    ) -> list[SimRequest]:
        """One priority level's sequences (in arrival order) in fair-share order, as weighted
        fair queuing orders packets: next is the next sequence of the tenant whose finish
        tag (virtual time plus what it is offered this step up to that sequence) is least;
        a tenant whose tag before its next sequence passes the bar yields the step;
        `seats_free` says whether a waiting sequence could start this step."""
        queues: dict[str, deque[SimRequest]] = {}
        for request in level:
            queues.setdefault(request.tenant, deque()).append(request)
        # With every seat taken, only tenants holding one set the bar: one that only waits
        # could not use its share and would hold the others still.
        setters = list(queues)
        if not seats_free:
            setters = [t for t in setters if any(r.running for r in queues[t])] or setters
        bar = min(self.vtime.get(t, 0) + sum(map(want, queues[t])) for t in setters)
        limit = bar + FAIR_QUANTUM
        heap = []
        for rank, (tenant, queue) in enumerate(queues.items()):
            start = self.vtime.get(tenant, 0)
            heap.append((start + want(queue[0]), rank, tenant, start))
        heapq.heapify(heap)
        ordered = []
        while heap:
            finish, rank, tenant, start = heapq.heappop(heap)
            if start > limit:
                continue
            ordered.append(queues[tenant].popleft())
            if queues[tenant]:
                heapq.heappush(heap, (finish + want(queues[tenant][0]), rank, tenant, finish))
        return ordered


class Urgency:
    """The best priority among the candidates of the last `URGENT_HOLD_STEPS` steps."""

    def __init__(self) -> None:
        self._seen: dict[int, int] = {}  # priority -> the last step it was a candidate

    def level(self, candidates: Iterable[SimRequest], step: int) -> int | None:
        """Record this step's candidates; the best priority still held (None: none)."""
        for request in candidates:
            self._seen[request.priority] = step
        self._seen = {p: at for p, at in self._seen.items() if step - at <= URGENT_HOLD_STEPS}
        return min(self._seen, default=None)


@dataclass(frozen=True, slots=True)
class Background:
    """This step's work of a priority worse than `above`: only the decodes in `allowed`
    (ids), and prefill only if `prefills`."""

    above: int
    allowed: frozenset[int]
    prefills: bool = True

    def holds_back(self, request: SimRequest) -> bool:
        """Whether a worse request's decode (or, without `prefills`, prefill) waits."""
        if request.priority <= self.above:
            return False
        return id(request) not in self.allowed if request.pending == 1 else not self.prefills


def background_rows(order: list[SimRequest], urgent: int | None, rows: int) -> Background | None:
    """Which worse-priority work a step runs (`rows` ≥ 1), from the step's order
    (`candidate_order`) as the engine picks it, decodes that ran least recently first:
    nothing while the urgent level has prefill left (a short step for it), `rows` decodes
    beside it decoding, `GAP_ROWS` and no prefill while none of it is here (its next
    request will wait for this step); None: everything (nothing urgent, or few enough)."""
    if urgent is None:
        return None
    urgent_here = [r for r in order if r.priority == urgent]
    if any(r.pending > 1 for r in urgent_here):
        return Background(urgent, frozenset())
    rows = rows if urgent_here else GAP_ROWS
    decodes = [r for r in order if r.priority > urgent and r.pending == 1]
    if urgent_here and len(decodes) <= rows:
        return None
    decodes.sort(key=lambda r: r.last_step)  # the longest without a turn first (stable)
    allowed = frozenset(id(r) for r in decodes[:rows])
    return Background(urgent, allowed, prefills=bool(urgent_here))


def candidate_order(
    policy: str,
    running: Iterable[SimRequest],
    waiting: Iterable[SimRequest],
    fair: FairShare,
    want: Want,
    seats_free: bool = True,
) -> list[SimRequest]:
    """The sequences a step offers its budget to, in that order; `want` is what a sequence
    would take this step (1 for a decode, its capped prefill chunk otherwise)."""
    if policy == "fcfs":
        return [*running, *waiting]
    ranked = sorted([*running, *waiting], key=lambda r: (r.priority, r.arrival))
    if policy == "priority":
        return ranked
    ordered: list[SimRequest] = []
    for _, level in groupby(ranked, key=lambda r: r.priority):
        ordered += fair.interleave(list(level), want, seats_free)
    return ordered
