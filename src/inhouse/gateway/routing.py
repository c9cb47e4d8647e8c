"""Routing: pick the least-loaded healthy replica that can serve a request, else queue
(bounded in depth and wait) or send to the fallback, per the model's policy."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from inhouse.api.errors import APIError
from inhouse.gateway.backends import Backend, BackendState
from inhouse.gateway.config import ModelRoute, Upstream
from inhouse.gateway.needs import Needs, missing_capability

SATURATED_RETRY_S = 1.0


@dataclass(frozen=True, slots=True)
class Lease:
    """Where one request goes: a replica (holding one of its slots) or the fallback."""

    upstream: Upstream
    backend: Backend | None
    fallback: bool
    queued_s: float


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
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {r: deque() for r in self.routes}
        self._picks = itertools.count(1)
        self.extra: list[Backend] = []  # replicas only a release names (see `canary`)

    def all_backends(self) -> list[Backend]:
        return [b for group in self.backends.values() for b in group] + self.extra

    def queue_depth(self, model: str) -> int:
        return sum(1 for w in self._waiters[model] if not w.done())

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
    ) -> Lease:
        """A slot on the least-loaded capable replica (of `pool`, default the model's
        configured ones), the fallback, or Overloaded."""
        start = self._clock()
        deadline = start + route.queue_max_wait_s
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
                ready = [b for b in capable if b.routable]
                if ready:
                    chosen = min(ready, key=Backend.load)
                    chosen.in_flight += 1
                    chosen.picked = next(self._picks)
                    return Lease(chosen.upstream, chosen, False, self._clock() - start)
                if may_fallback and (route.policy == "fallback" or not capable):
                    assert fallback is not None
                    return Lease(fallback, None, True, self._clock() - start)
                remaining = deadline - self._clock()
                if waiter is None and self.queue_depth(route.name) >= route.queue_max_depth:
                    raise self._overloaded(route, capable, "queue is full")
                if remaining <= 0:
                    raise self._overloaded(route, capable, "no replica freed up in time")
                waiter = asyncio.get_running_loop().create_future()
                self._waiters[route.name].append(waiter)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiter, remaining)
        finally:
            if waiter is not None and not waiter.done():
                waiter.cancel()

    def release(self, lease: Lease) -> None:
        """Give back a replica slot and wake one waiter of that model."""
        if lease.backend is None:
            return
        lease.backend.in_flight -= 1
        self.wake(lease.backend.model, everyone=False)

    def wake(self, model: str, everyone: bool = True) -> None:
        """Let waiters retry (all of them after a health change, one after a release)."""
        waiters = self._waiters[model]
        while waiters:
            waiter = waiters.popleft()
            if waiter.done():
                continue
            waiter.set_result(None)
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
