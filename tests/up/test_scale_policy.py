"""The autoscaler's policy (`up.scale_policy`) on real Backend objects and a real Router:
signals, windows, hysteresis, MIN and MAX, cooldown, the windowed TTFT quantile; and a
drained replica taking no new request (`Backend.draining`, `Router.add`/`remove`)."""

from __future__ import annotations

import asyncio

import pytest

from inhouse.gateway.backends import Backend, BackendState
from inhouse.gateway.config import ModelRoute, Upstream
from inhouse.gateway.metrics import LATENCY_BUCKETS
from inhouse.gateway.parsing import read_needs
from inhouse.gateway.routing import Router
from inhouse.up.autoscale import parse_replicas
from inhouse.up.scale_policy import (
    Hysteresis,
    ScaleSettings,
    TtftWindow,
    quantile,
    read_signals,
)

SETTINGS = ScaleSettings(up_after_s=30, down_after_s=300, cooldown_s=60, ttft_slo_s=2.0)
NEEDS = read_needs("chat/completions", {"messages": [{"content": "hi"}], "max_tokens": 1})


def replica(name: str, in_flight: int = 0, seats: int = 4, **load: float) -> Backend:
    upstream = Upstream(name=name, url=f"http://{name}", api_key=None, model="m",
                        max_num_seqs=seats)  # fmt: skip
    return Backend(upstream, "m", BackendState.UP, in_flight=in_flight, **load)


def test_demand_counts_the_gateway_queue_and_leaves_draining_replicas_out() -> None:
    draining = replica("c", in_flight=3)
    draining.draining = True
    s = read_signals([replica("a", 4, kv_usage=0.2), replica("b", 2, waiting=1.0), draining], 3,
                     None)  # fmt: skip
    assert (s.replicas, s.demand, s.seats, s.waiting, s.kv) == (2, 9, 4, 1.0, 0.2)
    assert s.per_seat(2) == 9 / 8 and s.per_seat(0) == float("inf")


def steps(policy: Hysteresis, backends: list[Backend], times: range, queued: int = 0):
    return [policy.step(float(t), read_signals(backends, queued, None)) for t in times]


def test_up_after_the_load_holds_for_the_window_then_a_cooldown() -> None:
    policy = Hysteresis(SETTINGS, 1, 3)
    full = [replica("a", in_flight=4)]
    assert steps(policy, full, range(0, 30), queued=2) == [None] * 30
    decision = policy.step(30.0, read_signals(full, 2, None))
    assert decision is not None and (decision.direction, decision.reason) == ("up", "queue")
    policy.settle(40.0)
    assert steps(policy, full, range(41, 100), queued=2) == [None] * 59  # cooldown, new window
    assert policy.step(100.0, read_signals(full, 2, None)) is not None


def test_a_dip_restarts_the_window() -> None:
    policy = Hysteresis(SETTINGS, 1, 3)
    busy, idle = [replica("a", in_flight=4)], [replica("a")]
    steps(policy, busy, range(0, 20), queued=1)
    assert policy.step(20.0, read_signals(idle, 0, None)) is None
    assert steps(policy, busy, range(21, 51), queued=1) == [None] * 30
    assert policy.step(51.0, read_signals(busy, 1, None)) is not None


def test_never_above_max_nor_below_min() -> None:
    policy = Hysteresis(SETTINGS, 2, 2)
    full = [replica("a", in_flight=4), replica("b", in_flight=4)]
    assert set(steps(policy, full, range(0, 400), queued=5)) == {None}
    assert set(steps(policy, [replica("a"), replica("b")], range(400, 1000))) == {None}


def test_down_only_when_the_load_fits_one_fewer_below_the_mark_for_the_longer_window() -> None:
    policy = Hysteresis(SETTINGS, 1, 3)
    # 4 requests on 2 × 4 seats: one replica would be full (1.0 > 0.5): stay
    assert set(steps(policy, [replica("a", 2), replica("b", 2)], range(0, 400))) == {None}
    light = [replica("a", 1), replica("b", 1)]  # 2 on one replica's 4 seats: 0.5
    assert steps(policy, light, range(400, 700)) == [None] * 300
    decision = policy.step(700.0, read_signals(light, 0, None))
    assert decision is not None and (decision.direction, decision.reason) == ("down", "low_load")
    waiting = [replica("a", 1), replica("b", 1, waiting=1.0)]  # anything waiting: not low
    assert set(steps(Hysteresis(SETTINGS, 1, 3), waiting, range(0, 400))) == {None}


@pytest.mark.parametrize(
    ("load", "reason"),
    [({"waiting": 3.0}, "waiting"), ({"kv_usage": 0.95}, "kv_cache")],
)
def test_engine_waiting_and_kv_use_scale_up(load: dict, reason: str) -> None:
    policy = Hysteresis(SETTINGS, 1, 2)
    backends = [replica("a", in_flight=1, **load)]
    steps(policy, backends, range(0, 30))
    decision = policy.step(30.0, read_signals(backends, 0, None))
    assert decision is not None and decision.reason == reason


def test_p99_ttft_above_the_slo_scales_up_and_half_of_it_lets_down() -> None:
    policy = Hysteresis(SETTINGS, 1, 2)
    calm = [replica("a", in_flight=1)]
    for t in range(0, 30):
        assert policy.step(float(t), read_signals(calm, 0, 2.5)) is None
    decision = policy.step(30.0, read_signals(calm, 0, 2.5))
    assert decision is not None and decision.reason == "ttft"
    two = [replica("a", 1), replica("b")]
    slowish = Hysteresis(SETTINGS, 1, 2)
    assert {slowish.step(float(t), read_signals(two, 0, 1.5)) for t in range(0, 600)} == {None}


def test_the_ttft_window_forgets_what_is_older_than_it() -> None:
    window = TtftWindow(30)

    def buckets(slow: int, fast: int) -> list[tuple[float, float]]:
        return [(le, fast + (slow if le >= 5 else 0)) for le in (*LATENCY_BUCKETS, float("inf"))]

    assert window.add(0.0, buckets(0, 0)) is None
    assert window.add(10.0, buckets(50, 50)) == pytest.approx(2.5 + 2.5 * 49 / 50)
    window.add(20.0, buckets(50, 50))
    assert window.add(45.0, buckets(50, 150)) <= 0.01  # the slow ones fell out of the window
    assert quantile([(1.0, 0.0), (float("inf"), 3.0)], 0.99) == 1.0


@pytest.mark.parametrize("text", ["3:1", "0:2", "0", "a:b", "1:", ":2", "1:2:3", "-1:2"])
def test_a_bad_replica_range_says_what_is_wrong(text: str) -> None:
    with pytest.raises(ValueError, match="--replicas"):
        parse_replicas(text)


def test_replica_ranges() -> None:
    assert (parse_replicas("2").low, parse_replicas("2").scales) == (2, False)
    assert (parse_replicas("1:3").high, parse_replicas("1:3").scales) == (3, True)


def test_flapping_marks_are_refused() -> None:
    with pytest.raises(ValueError, match="no flapping"):
        ScaleSettings(up_above=0.5, down_below=0.9).check()


def test_a_draining_replica_takes_no_new_request_and_an_added_one_does() -> None:
    async def run() -> None:
        a, b = replica("a"), replica("b")
        route = ModelRoute(name="m", backends=(a.upstream,), routing="least-loaded")
        router = Router([route], 10.0)
        (first,) = router.backends["m"]
        first.state = BackendState.UP
        router.add(b)
        assert router.replicas("m") == 2 and router.generation == 1
        first.draining = True
        leases = [await router.acquire(route, NEEDS, False) for _ in range(3)]
        assert {lease.backend.upstream.name for lease in leases} == {"b"}
        router.remove(first)
        assert router.replicas("m") == 1 and router.generation == 2

    asyncio.run(run())
