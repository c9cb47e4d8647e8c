"""Seats kept for interactive requests (`gateway.seats`) on the real Router and Backend
objects: later classes hold at most `max_num_seqs − interactive_seats` of a replica's
slots and wait in the gateway beyond that, an interactive request takes a kept seat at
once, and the keys parse or are one clear ConfigError."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inhouse.gateway.backends import BackendState
from inhouse.gateway.config import ConfigError, ModelRoute, Upstream
from inhouse.gateway.config_file import parse_config
from inhouse.gateway.parsing import read_needs
from inhouse.gateway.routing import Lease, Router
from inhouse.gateway.seats import class_slots

NEEDS = read_needs("chat/completions", {"messages": [{"content": "hi"}], "max_tokens": 1})


def _route(seqs: int | None = 4, seats: int = 1, replicas: int = 1) -> ModelRoute:
    backends = tuple(
        Upstream(f"b{i}", f"http://127.0.0.1:{9000 + i}", None, "m", max_num_seqs=seqs)
        for i in range(replicas)
    )
    return ModelRoute("m", backends, interactive_seats=seats, queue_max_wait_s=5.0)


def _router(route: ModelRoute) -> Router:
    router = Router([route], health_interval_s=7.0)
    for backend in router.backends["m"]:
        backend.state = BackendState.UP
    return router


async def _settled(task: asyncio.Task[Lease]) -> bool:
    """Whether the acquire has its lease after the loop ran its ready callbacks."""
    for _ in range(5):
        await asyncio.sleep(0)
    return task.done()


def test_a_batch_flood_leaves_the_kept_seat_to_an_interactive_request() -> None:
    async def scenario() -> None:
        route = _route(seqs=4)
        router = _router(route)
        batch = [await router.acquire(route, NEEDS, True, priority="batch") for _ in range(3)]
        fourth = asyncio.create_task(router.acquire(route, NEEDS, True, priority="batch"))
        default = asyncio.create_task(router.acquire(route, NEEDS, True))
        assert not await _settled(fourth) and not await _settled(default)
        assert router.queue_depth("m") == 2
        chat = await router.acquire(route, NEEDS, True, priority="interactive")  # at once
        assert chat.queued_s < 0.1 and router.backends["m"][0].in_flight == 4
        router.release(chat)  # the kept seat frees: still not theirs
        assert not await _settled(fourth) and not await _settled(default)
        router.release(batch[0])  # a seat of theirs frees: the sooner class takes it
        assert await _settled(default) and not await _settled(fourth)
        router.release(batch[1])
        assert await _settled(fourth)

    asyncio.run(scenario())


def test_each_replica_keeps_its_seat_and_the_flood_spreads_over_both() -> None:
    async def scenario() -> list[int]:
        route = _route(seqs=3, replicas=2)
        router = _router(route)
        for _ in range(4):
            await router.acquire(route, NEEDS, True, priority="batch")
        late = asyncio.create_task(router.acquire(route, NEEDS, True, priority="batch"))
        assert not await _settled(late)
        for _ in range(2):
            await router.acquire(route, NEEDS, True, priority="interactive")
        late.cancel()
        return [b.in_flight for b in router.backends["m"]]

    assert asyncio.run(scenario()) == [3, 3]


@pytest.mark.parametrize(
    ("seqs", "seats", "batch", "chat"),
    [
        (8, 1, 7, 64),  # the default: one seat of eight kept
        (8, 3, 5, 64),
        (8, 0, 64, 64),  # 0 turns the policy off
        (None, 1, 64, 64),  # max_num_seqs unknown: every slot is every class's
        (1, 1, 1, 64),  # never fewer than one: a class is slowed, not shut out
        (200, 1, 64, 64),  # max_in_flight still bounds every class
    ],
)
def test_the_slots_of_each_class(seqs: int | None, seats: int, batch: int, chat: int) -> None:
    upstream = Upstream("b", "http://127.0.0.1:9000", None, "m", max_num_seqs=seqs)
    slots = [class_slots(upstream, c, seats) for c in ("batch", "default", "interactive")]
    assert slots == [batch, batch, chat]


def _config(model: dict[str, Any], backend: dict[str, Any]) -> dict[str, Any]:
    backends = [{"url": "http://127.0.0.1:8001", **backend}]
    return {"models": [{"name": "m", "backends": backends, **model}]}


def test_the_keys_parse_and_default_to_one_seat_of_an_unknown_batch() -> None:
    (route,) = parse_config(_config({"interactive_seats": 2}, {"max_num_seqs": 16})).models
    assert (route.interactive_seats, route.backends[0].max_num_seqs) == (2, 16)
    (plain,) = parse_config(_config({}, {})).models
    assert (plain.interactive_seats, plain.backends[0].max_num_seqs) == (1, None)


@pytest.mark.parametrize(
    ("model", "backend", "says"),
    [
        ({"interactive_seats": -1}, {}, "interactive_seats must be an integer >= 0"),
        ({"interactive_seats": True}, {}, "interactive_seats must be an integer >= 0"),
        ({"interactive_seats": 1.5}, {}, "interactive_seats must be an integer >= 0"),
        ({}, {"max_num_seqs": 0}, "max_num_seqs must be a positive integer"),
        ({}, {"max_num_seqs": "8"}, "max_num_seqs must be a positive integer"),
    ],
)
def test_a_wrong_seat_key_is_one_clear_error(
    model: dict[str, Any], backend: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_config(_config(model, backend))


VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=4)
)


@settings(max_examples=200, deadline=None)
@given(seats=VALUES, seqs=VALUES)
def test_any_value_of_the_seat_keys_parses_or_is_a_config_error(seats: Any, seqs: Any) -> None:
    model = {} if seats is None else {"interactive_seats": seats}
    backend = {} if seqs is None else {"max_num_seqs": seqs}
    with contextlib.suppress(ConfigError):
        parse_config(_config(model, backend))
