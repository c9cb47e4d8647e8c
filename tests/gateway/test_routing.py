"""Router decisions on real Router/Backend objects: least loaded, bounded queue, fallback."""

from __future__ import annotations

import asyncio

import pytest

from inhouse.gateway.backends import BackendState
from inhouse.gateway.config import ModelRoute, Upstream
from inhouse.gateway.parsing import read_needs
from inhouse.gateway.routing import Overloaded, Router

NEEDS = read_needs("chat/completions", {"messages": [{"content": "hi"}], "max_tokens": 1})


def _route(policy: str = "queue", depth: int = 2, wait: float = 0.2, slots: int = 1) -> ModelRoute:
    backends = tuple(
        Upstream(f"b{i}", f"http://127.0.0.1:{9000 + i}", None, "m", max_in_flight=slots)
        for i in range(2)
    )
    fallback = Upstream("fb", "http://127.0.0.1:9100", None, "m", kind="openai")
    return ModelRoute("m", backends, fallback, policy, queue_max_depth=depth, queue_max_wait_s=wait)  # type: ignore[arg-type]


def _router(route: ModelRoute, *states: BackendState) -> Router:
    router = Router([route], health_interval_s=7.0)
    for backend, state in zip(router.backends["m"], states, strict=True):
        backend.state = state
    return router


UP, DOWN = BackendState.UP, BackendState.DOWN


def test_least_loaded_replica_wins() -> None:
    async def scenario() -> list[str]:
        router = _router(_route(slots=4), UP, UP)
        router.backends["m"][0].waiting = 3
        leases = [await router.acquire(router.routes["m"], NEEDS, True) for _ in range(4)]
        return [lease.upstream.name for lease in leases]

    assert asyncio.run(scenario()) == ["b1", "b1", "b1", "b0"]


def test_equally_loaded_replicas_take_turns() -> None:
    async def scenario() -> list[str]:
        router = _router(_route(slots=4), UP, UP)
        names = []
        for _ in range(4):  # one at a time: in-flight counts are always equal
            lease = await router.acquire(router.routes["m"], NEEDS, True)
            names.append(lease.upstream.name)
            router.release(lease)
        return names

    assert asyncio.run(scenario()) == ["b0", "b1", "b0", "b1"]


def test_down_and_starting_replicas_get_nothing() -> None:
    async def scenario() -> str:
        router = _router(_route(slots=4), DOWN, UP)
        return (await router.acquire(router.routes["m"], NEEDS, True)).upstream.name

    assert asyncio.run(scenario()) == "b1"


def test_queued_request_takes_the_slot_a_release_frees() -> None:
    async def scenario() -> float:
        router = _router(_route(wait=5.0), UP, DOWN)
        route = router.routes["m"]
        held = await router.acquire(route, NEEDS, True)
        waiting = asyncio.create_task(router.acquire(route, NEEDS, True))
        await asyncio.sleep(0.05)
        assert router.queue_depth("m") == 1
        router.release(held)
        lease = await waiting
        assert router.queue_depth("m") == 0
        return lease.queued_s

    assert 0.04 < asyncio.run(scenario()) < 1.0


def test_full_queue_is_429_and_timeout_without_healthy_backend_is_503() -> None:
    async def scenario() -> tuple[Overloaded, Overloaded]:
        router = _router(_route(depth=1, wait=0.2), UP, DOWN)
        route = router.routes["m"]
        await router.acquire(route, NEEDS, True)
        queued = asyncio.create_task(router.acquire(route, NEEDS, True))
        await asyncio.sleep(0.01)
        with pytest.raises(Overloaded) as full:
            await router.acquire(route, NEEDS, True)
        with pytest.raises(Overloaded):
            await queued
        router.backends["m"][0].state = DOWN
        with pytest.raises(Overloaded) as down:
            await router.acquire(route, NEEDS, True)
        return full.value, down.value

    full, down = asyncio.run(scenario())
    assert full.status_code == 429 and full.retry_after_s > 0
    assert down.status_code == 503 and down.retry_after_s == 7.0


def test_a_health_change_wakes_waiters() -> None:
    async def scenario() -> str:
        router = _router(_route(wait=5.0), DOWN, DOWN)
        waiting = asyncio.create_task(router.acquire(router.routes["m"], NEEDS, True))
        await asyncio.sleep(0.05)
        router.backends["m"][1].state = UP
        router.wake("m")
        return (await waiting).upstream.name

    assert asyncio.run(scenario()) == "b1"


def test_fallback_policy_and_keys_that_forbid_it() -> None:
    async def scenario() -> tuple[bool, int]:
        router = _router(_route(policy="fallback", wait=0.1), DOWN, DOWN)
        lease = await router.acquire(router.routes["m"], NEEDS, True)
        with pytest.raises(Overloaded) as err:
            await router.acquire(router.routes["m"], NEEDS, allow_fallback=False)
        return lease.fallback, err.value.status_code

    assert asyncio.run(scenario()) == (True, 503)


def test_refusal_only_when_no_upstream_could_serve() -> None:
    router = _router(_route(), UP, UP)
    image = read_needs(
        "chat/completions",
        {
            "messages": [
                {
                    "content": [
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
                    ]
                }
            ]
        },
    )
    assert router.capability_gap(router.routes["m"], image, True) == "model does not support vision"


def test_a_slot_freed_for_a_waiter_is_not_taken_by_the_next_arrival() -> None:
    """A release wakes the first waiter; a request arriving before that waiter is back
    queues behind it (it once took the slot, and a steady stream of arrivals starved the
    queue: a probe behind a flood waited out its 30 s)."""

    async def scenario() -> tuple[bool, bool, bool]:
        router = _router(_route(wait=5.0), UP, DOWN)
        route = router.routes["m"]
        held = await router.acquire(route, NEEDS, True)
        waiting = asyncio.create_task(router.acquire(route, NEEDS, True))
        await asyncio.sleep(0.01)
        router.release(held)
        newcomer = asyncio.create_task(router.acquire(route, NEEDS, True))
        await asyncio.sleep(0.01)
        first = (waiting.done(), newcomer.done())
        router.release(await waiting)
        await asyncio.sleep(0.01)
        return (*first, newcomer.done())

    assert asyncio.run(scenario()) == (True, False, True)
