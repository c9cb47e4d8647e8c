"""GCRA on an injected clock: smooth, exact Retry-After, shared across replicas via the DB."""

from __future__ import annotations

import math
import threading

import pytest

from inhouse.gateway.db_open import open_database
from inhouse.gateway.limits import Gcra, MemoryTatStore, SqlTatStore


def test_burst_equals_the_limit_then_refills_smoothly(clock) -> None:
    gcra = Gcra(MemoryTatStore(), clock)
    states = [gcra.acquire("k", 6, 1) for _ in range(7)]
    assert [s.allowed for s in states] == [True] * 6 + [False]
    assert [s.remaining for s in states[:6]] == [5, 4, 3, 2, 1, 0]
    denied = states[-1]
    assert denied.retry_after_s == pytest.approx(10.0)  # one request per 10 s at 6/min
    clock.advance(9.9)
    assert not gcra.acquire("k", 6, 1).allowed
    clock.advance(0.1)
    assert gcra.acquire("k", 6, 1).allowed


def test_retry_after_is_exactly_when_the_cost_fits(clock) -> None:
    gcra = Gcra(MemoryTatStore(), clock)
    assert gcra.acquire("t", 1000, 900).allowed
    denied = gcra.acquire("t", 1000, 300)
    assert not denied.allowed and denied.retry_after_s == pytest.approx(12.0)
    assert denied.remaining == 100
    clock.advance(denied.retry_after_s)
    assert gcra.acquire("t", 1000, 300).allowed


def test_a_cost_over_the_limit_never_passes(clock) -> None:
    state = Gcra(MemoryTatStore(), clock).acquire("t", 100, 101)
    assert not state.allowed and math.isinf(state.retry_after_s)


def test_adjust_refunds_and_charges(clock) -> None:
    gcra = Gcra(MemoryTatStore(), clock)
    gcra.acquire("t", 600, 600)
    assert gcra.peek("t", 600).remaining == 0
    gcra.adjust("t", 600, -200)
    assert gcra.peek("t", 600).remaining == 200
    gcra.adjust("t", 600, 50)
    assert gcra.peek("t", 600).remaining == 150
    gcra.adjust("t", 600, -10_000)
    assert gcra.peek("t", 600).remaining == 600 and gcra.peek("t", 600).reset_s == 0


def test_reset_is_time_until_full(clock) -> None:
    gcra = Gcra(MemoryTatStore(), clock)
    state = gcra.acquire("k", 60, 3)
    assert state.reset_s == pytest.approx(3.0)


def test_two_replicas_sharing_the_database_share_one_limit(db_url: str) -> None:
    db = open_database(db_url)
    frozen = 5_000.0
    replicas = [Gcra(SqlTatStore(db), lambda: frozen) for _ in range(2)]
    admitted = []
    lock = threading.Lock()

    def hammer(gcra: Gcra) -> None:
        for _ in range(15):
            allowed = gcra.acquire("rpm:1", 10, 1).allowed
            with lock:
                admitted.append(allowed)

    threads = [threading.Thread(target=hammer, args=(r,)) for r in replicas for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(admitted) == 10 and len(admitted) == 60
