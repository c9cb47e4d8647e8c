"""Batch requests leave replicas free while online requests come (`gateway.seats`), on real
Router and Backend objects with the router's clock in the test's hands."""

from __future__ import annotations

import asyncio
import time

from inhouse.gateway.backends import BackendState
from inhouse.gateway.config import ModelRoute, Upstream
from inhouse.gateway.parsing import read_needs
from inhouse.gateway.routing import Lease, Overloaded, Router
from inhouse.gateway.seats import ONLINE_WINDOW_S

NEEDS = read_needs("chat/completions", {"messages": [{"content": "hi"}], "max_tokens": 1})


class Clock:
    """The monotonic clock, moved on by `skip` seconds (waits still run in real time)."""

    def __init__(self) -> None:
        self.skip = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.skip


def _router(replicas: int = 2, free: int = 1, clock: Clock | None = None) -> Router:
    backends = tuple(
        Upstream(f"b{i}", f"http://127.0.0.1:{9000 + i}", None, "m", max_in_flight=4)
        for i in range(replicas)
    )
    route = ModelRoute("m", backends, queue_max_wait_s=0.05, batch_free_replicas=free)
    router = Router([route], health_interval_s=7.0, clock=clock or Clock())
    for backend in router.backends["m"]:
        backend.state = BackendState.UP
    return router


async def _take(router: Router, priority: str, count: int) -> list[str]:
    """Where `count` requests of `priority` go, each holding its slot (a 429 is '429')."""
    names = []
    for _ in range(count):
        try:
            lease: Lease = await router.acquire(router.routes["m"], NEEDS, False, priority=priority)
            names.append(lease.upstream.name)
        except Overloaded as refused:
            names.append(str(refused.status_code))
    return names


def test_batch_fills_only_the_first_replica_while_online_requests_come() -> None:
    async def scenario() -> tuple[list[str], list[str]]:
        router = _router()
        online = await _take(router, "interactive", 1)
        return online, await _take(router, "batch", 5)

    online, batch = asyncio.run(scenario())
    assert online == ["b0"]  # the least-loaded, before any batch: a chat may use either
    assert batch == ["b0", "b0", "b0", "429", "429"]  # b0's 4 slots, b1 kept free


def test_a_default_request_counts_as_online_and_may_use_the_kept_replica() -> None:
    async def scenario() -> list[str]:
        router = _router()
        await _take(router, "batch", 2)  # no online request yet: both replicas
        await _take(router, "default", 1)
        return await _take(router, "batch", 3) + await _take(router, "default", 1)

    assert asyncio.run(scenario()) == ["b0", "b0", "429", "b1"]


def test_with_no_online_request_for_the_window_batch_takes_every_replica() -> None:
    async def scenario() -> list[str]:
        clock = Clock()
        router = _router(clock=clock)
        await _take(router, "interactive", 1)
        clock.skip += ONLINE_WINDOW_S + 1
        return await _take(router, "batch", 6)

    assert sorted(asyncio.run(scenario())) == ["b0", "b0", "b0", "b1", "b1", "b1"]


def test_batch_always_keeps_one_replica_and_the_setting_can_turn_it_off() -> None:
    async def scenario(replicas: int, free: int, down: int | None) -> list[str]:
        router = _router(replicas, free)
        if down is not None:
            router.backends["m"][down].state = BackendState.DOWN
        await _take(router, "interactive", 1)
        for backend in router.backends["m"]:
            backend.in_flight = 0
        return sorted(set(await _take(router, "batch", 4 * replicas)) - {"429"})

    assert asyncio.run(scenario(3, 1, None)) == ["b0", "b1"]
    assert asyncio.run(scenario(3, 2, None)) == ["b0"]
    assert asyncio.run(scenario(2, 5, None)) == ["b0"]  # never every replica
    assert asyncio.run(scenario(2, 1, 0)) == ["b1"]  # b0 down: b1 is all batch has
    assert asyncio.run(scenario(2, 0, None)) == ["b0", "b1"]
