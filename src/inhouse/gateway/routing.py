"""Routing: pick the healthy replica that can serve a request, the one most likely to hold
its prompt's prefix within the model's load slack (`affinity`) or else the least-loaded,
or queue (bounded in depth and wait) or send to the fallback, per the model's policy.

The queue is ordered by priority class (`priority`), then arrival; a new request does not
take a free slot that a request waiting (or woken) ahead of it could take, so a freed slot
goes to the queue, not to the next arrival; a request woken that finds no slot after all
(its class may not take the one that freed: `seats`) goes back to its place, not to the
end. Each class waits at most its `queue_max_wait_s`; when the queue is full, a request of
a sooner class takes the place of the last one of a later class, which gets the 429."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from inhouse.api.errors import APIError
from inhouse.gateway.backends import Backend, BackendState
from inhouse.gateway.config import ModelRoute, Upstream
from inhouse.gateway.needs import Needs, missing_capability
from inhouse.gateway.priority import DEFAULT_CLASS, rank
from inhouse.gateway.seats import KEPT_FROM, ONLINE_WINDOW_S, batch_free, takes

SATURATED_RETRY_S = 1.0
SERVICE_EWMA = 0.3  # weight of the newest call in a model's recent time per call


@dataclass(frozen=True, slots=True)
class Lease:
    """Where one request goes: a replica (holding one of its slots) or the fallback."""

    upstream: Upstream
    backend: Backend | None
    fallback: bool
    queued_s: float
    acquired_at: float = 0.0  # on the router's clock: how long the call held its slot
    prefix_blocks: int = 0  # leading prompt blocks the replica was sent before, when they chose it


class Overloaded(APIError):
    """No replica could take the request within the queue limits (429) or none is up (503)."""

    def __init__(self, status: int, message: str, retry_after_s: float) -> None:
        kind = "rate_limit_exceeded" if status == 429 else "service_unavailable"
        super().__init__(status, message, type=kind, code="overloaded" if status == 429 else kind)
        self.retry_after_s = retry_after_s


class Router:
    """Backends per model, their in-flight counts, and each model's bounded wait queue."""

    def __init__(
        self,
        routes: Iterable[ModelRoute],
        health_interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.routes = {r.name: r for r in routes}
        self.backends = {
            r.name: [Backend(upstream=u, model=r.name) for u in r.backends]
            for r in self.routes.values()
        }
        self._health_interval = health_interval_s
        self._clock = clock
        # Per model, a heap of (class rank, arrival number, push number, waiter): a request
        # that waits again keeps its place, and the push number keeps its entries apart.
        self._waiters: dict[str, list[tuple[int, int, int, asyncio.Future[None]]]] = {
            r: [] for r in self.routes
        }
        # Per model, the waiters not back from their wait yet (queued, or woken and on their
        # way to the slot): class rank and the replicas they could take (by id).
        self._wanting: dict[str, dict[asyncio.Future[None], tuple[int, frozenset[int]]]] = {
            r: {} for r in self.routes
        }
        self._arrivals = itertools.count()
        self._pushes = itertools.count()
        self._picks = itertools.count(1)
        self.service_s: dict[str, float] = {}  # per model: recent seconds a call holds a slot
        self._holding: dict[str, dict[float, int]] = {}  # per model: slots held since when
        self._online_at: dict[str, float] = {}  # per model: the last request not of batch
        self.extra: list[Backend] = []  # replicas only a release names (see `canary`)
        self.generation = 0  # counts replicas added and removed at run time (`add`, `remove`)

    def all_backends(self) -> list[Backend]:
        return [b for group in self.backends.values() for b in group] + self.extra

    def add(self, backend: Backend) -> None:
        """Route to a replica started at run time (`inhouse up --replicas MIN:MAX`) from now
        on, and let its model's waiters try it."""
        self.backends[backend.model].append(backend)
        self.generation += 1
        self.wake(backend.model)

    def remove(self, backend: Backend) -> None:
        """Forget a replica (drained first: `Backend.draining`, then no request in flight)."""
        backend.draining = True  # a release's pool may hold it until its view is resolved again
        self.backends[backend.model].remove(backend)
        self.generation += 1

    def replicas(self, model: str) -> int:
        """The model's replicas not being drained."""
        return sum(1 for b in self.backends[model] if not b.draining)

    def queue_depth(self, model: str, up_to_rank: int | None = None) -> int:
        """Requests waiting for `model` (of classes ranked `up_to_rank` or sooner)."""
        return sum(
            1
            for r, _, _, w in self._waiters[model]
            if not w.done() and (up_to_rank is None or r <= up_to_rank)
        )

    def capability_gap(self, route: ModelRoute, needs: Needs, allow_fallback: bool) -> str | None:
        """Why no upstream of this model could ever serve the request (then answer 400)."""
        reasons = [missing_capability(b, needs) for b in route.backends]
        if route.fallback is not None and allow_fallback and route.allow_fallback:
            reasons.append(missing_capability(route.fallback, needs))
        return None if any(r is None for r in reasons) else reasons[0]

    async def acquire(
        self,
        route: ModelRoute,
        needs: Needs,
        allow_fallback: bool,
        exclude: frozenset[int] = frozenset(),
        pool: list[Backend] | None = None,
        priority: str = DEFAULT_CLASS,
        prefix: tuple[bytes, ...] = (),
    ) -> Lease:
        """A slot on a capable replica (of `pool`, default the model's configured ones):
        the one sent most of `prefix` (`affinity.prefix_chain`) within the route's slack,
        else the least-loaded; the fallback, or Overloaded. A request of class `priority`
        waits behind the sooner classes and at most its class's wait."""
        start = self._clock()
        deadline = start + route.max_wait(priority)
        if priority != KEPT_FROM:
            self._online_at[route.name] = start
        place = (rank(priority), next(self._arrivals))
        capable = [
            b
            for b in (self.backends[route.name] if pool is None else pool)
            if id(b) not in exclude and missing_capability(b.upstream, needs) is None
        ]
        fallback = route.fallback
        may_fallback = (
            fallback is not None
            and allow_fallback
            and route.allow_fallback
            and missing_capability(fallback, needs) is None
        )
        waiter: asyncio.Future[None] | None = None
        try:
            while True:
                kept = self._kept_from(route, priority, capable)
                ready = [
                    b
                    for b in capable
                    if takes(b, priority, route.interactive_seats) and id(b) not in kept
                ]
                behind = waiter is None and self._waits_behind(route.name, place[0], ready)
                if ready and not behind:
                    chosen, shared = _pick(route, ready, prefix)
                    chosen.prefixes.remember(prefix)
                    chosen.in_flight += 1
                    chosen.picked = next(self._picks)
                    now = self._clock()
                    held = self._holding.setdefault(chosen.model, {})
                    held[now] = held.get(now, 0) + 1
                    return Lease(chosen.upstream, chosen, False, now - start, now, shared)
                if not ready and may_fallback and (route.policy == "fallback" or not capable):
                    assert fallback is not None
                    return Lease(fallback, None, True, self._clock() - start)
                remaining = deadline - self._clock()
                if (
                    waiter is None
                    and self.queue_depth(route.name) >= route.queue_max_depth
                    and not self._make_room(route, place[0], capable)
                ):
                    raise self._overloaded(route, capable, "queue is full")
                if remaining <= 0:
                    raise self._overloaded(route, capable, "no replica freed up in time")
                waiter = asyncio.get_running_loop().create_future()
                entry = (*place, next(self._pushes), waiter)
                heapq.heappush(self._waiters[route.name], entry)
                if behind:  # a slot is free for those ahead: the first of them is told
                    self.wake(route.name, everyone=False, up_to_rank=place[0])
                wanting = self._wanting[route.name]
                wanting[waiter] = (place[0], frozenset(id(b) for b in capable))
                try:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(waiter, remaining)
                finally:
                    del wanting[waiter]
        finally:
            if waiter is not None and not waiter.done():
                waiter.cancel()

    def _kept_from(
        self, route: ModelRoute, priority: str, capable: list[Backend]
    ) -> frozenset[int]:
        """The replicas a request of `priority` must leave free (`seats.batch_free`): for
        batch, while online requests came within the window."""
        online_at = self._online_at.get(route.name)
        if priority != KEPT_FROM or online_at is None:
            return frozenset()
        if self._clock() - online_at > ONLINE_WINDOW_S:
            return frozenset()
        return batch_free(capable, route.batch_free_replicas)

    def _waits_behind(self, model: str, rank: int, ready: list[Backend]) -> bool:
        """Whether a new request of class `rank` leaves the `ready` replicas' free slots to
        requests already waiting (of its class or sooner, that could take one of them): a
        slot freed for a waiter is the waiter's, not the next newcomer's."""
        free = {id(b) for b in ready}
        wanting = self._wanting[model].values()
        return any(r <= rank and not free.isdisjoint(ids) for r, ids in wanting)

    def _make_room(self, route: ModelRoute, place: int, capable: list[Backend]) -> bool:
        """In a full queue, refuse the last waiter of a later class than `place` (its
        request gets the 429 this one would have had); whether there was one."""
        later = [w for w in self._waiters[route.name] if w[0] > place and not w[-1].done()]
        if not later:
            return False
        last = max(later, key=lambda w: (w[0], w[1]))
        last[-1].set_exception(self._overloaded(route, capable, "a sooner class took its place"))
        return True

    def release(self, lease: Lease) -> None:
        """Give back a replica slot, note how long it was held, and wake the first waiter
        of that model."""
        if lease.backend is None:
            return
        lease.backend.in_flight -= 1
        model = lease.backend.model
        holding = self._holding.get(model, {})
        if holding.get(lease.acquired_at, 0) > 1:
            holding[lease.acquired_at] -= 1
        else:
            holding.pop(lease.acquired_at, None)
        held = self._clock() - lease.acquired_at
        recent = self.service_s.get(model)
        self.service_s[model] = held if recent is None else recent + SERVICE_EWMA * (held - recent)
        self.wake(model, everyone=False)

    def recent_service_s(self, model: str) -> float:
        """Seconds a call of `model` holds its slot: the recent average of those that
        ended, else (none has yet) the age of the oldest still running, else 0."""
        if model in self.service_s:
            return self.service_s[model]
        holding = self._holding.get(model)
        return self._clock() - min(holding) if holding else 0.0

    def wake(self, model: str, everyone: bool = True, up_to_rank: int | None = None) -> None:
        """Let waiters retry (all of them after a health change, the first in class order
        after a release; only one of a class ranked `up_to_rank` or sooner, where given)."""
        waiters = self._waiters[model]
        while waiters:
            if waiters[0][-1].done():
                heapq.heappop(waiters)
                continue
            if up_to_rank is not None and waiters[0][0] > up_to_rank:
                return
            heapq.heappop(waiters)[-1].set_result(None)
            if not everyone:
                return

    def health(self) -> tuple[int, dict[str, Any]]:
        """Per-model backend states; 503 when some model has neither a replica up nor a fallback."""
        models: dict[str, Any] = {}
        ok = True
        for name, backends in self.backends.items():
            route = self.routes[name]
            up = any(b.state is BackendState.UP for b in backends)
            ok = ok and (up or route.fallback is not None)
            models[name] = {
                "status": "up" if up else "down",
                "queue_depth": self.queue_depth(name),
                "fallback": None if route.fallback is None else route.fallback.name,
                "backends": [b.describe() for b in backends],
            }
        return (200 if ok else 503), {"status": "ok" if ok else "degraded", "models": models}

    def _overloaded(self, route: ModelRoute, capable: list[Backend], why: str) -> Overloaded:
        if any(b.state is BackendState.UP for b in capable):
            return Overloaded(
                429, f"model {route.name!r} is overloaded ({why}); retry shortly", SATURATED_RETRY_S
            )
        return Overloaded(
            503,
            f"no healthy backend for model {route.name!r} ({why})",
            self._health_interval,
        )


def _pick(
    route: ModelRoute, ready: list[Backend], prefix: tuple[bytes, ...]
) -> tuple[Backend, int]:
    """The replica sent the longest run of `prefix`'s leading blocks, while it carries at
    most the route's slack above the least-loaded (the blocks shared, which chose it), else
    the least-loaded (0)."""
    least = min(ready, key=Backend.load)
    if route.routing != "prefix" or not prefix:
        return least, 0
    sent = {id(b): b.prefixes.shared(prefix) for b in ready}
    most = max(sent.values())
    if not most:
        return least, 0
    holder = min((b for b in ready if sent[id(b)] == most), key=Backend.load)
    if holder.load()[0] - least.load()[0] <= route.prefix_slack:
        return holder, most
    return least, 0
