"""Holds on a real SQLite file: a key's quota and its team's quota and budget reserved
together or not at all, settled exactly once (by the gateway or by its replayed audit
row), periods that roll over, and holds of a dead gateway returned once they expire."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select

from inhouse.cost.settings import TokenPrices
from inhouse.gateway.db import holds
from inhouse.gateway.db_open import open_database
from inhouse.gateway.holds import Charge, HoldStore
from inhouse.gateway.keys import ApiKey, KeyStore
from inhouse.gateway.usage.teams import TeamStore

DAY = 86400.0
ManualClock = Any  # tests/gateway/conftest.py's clock fixture: call it, advance it
PRICES = TokenPrices(1e6, 1e6)  # a token costs 1


@pytest.fixture
def holder(db_url: str, clock: ManualClock) -> HoldStore:
    return HoldStore(open_database(db_url), PRICES, 10.0, clock)


@pytest.fixture
def teams(db_url: str, clock: ManualClock) -> TeamStore:
    return TeamStore(open_database(db_url), clock)


def held(holder: HoldStore, key: ApiKey, tokens: int, at: float, money: float = 0.0) -> str:
    reservation = holder.reserve(key, tokens, money, at)
    assert not reservation.refused and reservation.hold is not None
    return reservation.hold


def live_holds(db_url: str) -> int:
    with open_database(db_url).connect() as conn:
        query = select(func.count()).select_from(holds).where(holds.c.released.is_(False))
        return int(conn.execute(query).scalar_one())


def test_a_key_quota_holds_until_settled_and_rolls_over(
    store: KeyStore, holder: HoldStore, clock: ManualClock
) -> None:
    key, _ = store.create("q", quota_tokens=100, quota_period_s=3600)
    first = held(holder, key, 60, clock.now)
    assert holder.reserve(key, 50, 0.0, clock.now).key_used == 60  # the first is in flight
    holder.settle(Charge(first, 20, 0.0))
    second = held(holder, key, 50, clock.now)
    holder.settle(Charge(second, 55, 0.0))  # usage may overshoot
    assert store.get("q").quota_used_at(clock.now) == 75
    assert holder.reserve(key, 26, 0.0, clock.now).key_used == 75
    old = held(holder, key, 10, clock.now)
    clock.advance(3600)
    assert store.get("q").quota_used_at(clock.now) == 0
    held(holder, store.get("q"), 100, clock.now)
    holder.settle(Charge(old, 10, 0.0))  # an old period's: nothing is owed to this one
    assert store.get("q").quota_used_at(clock.now) == 100


def test_a_team_quota_and_budget_hold_while_they_fit(
    store: KeyStore, holder: HoldStore, teams: TeamStore, clock: ManualClock
) -> None:
    teams.create("search", DAY, quota_tokens=100, budget=1.0)
    key, _ = store.create("t", team="search")  # no quota of its own
    first = held(holder, key, 60, clock(), 0.5)
    refused = holder.reserve(key, 50, 0.1, clock()).team
    assert refused is not None and refused.used_at(clock()) == (60, 0.5)
    assert holder.reserve(key, 10, 0.6, clock()).team is not None  # tokens fit, money not
    holder.settle(Charge(first, 20, 0.1))  # the real charge was smaller
    assert teams.get("search").used_at(clock()) == (20, pytest.approx(0.1))
    held(holder, key, 80, clock(), 0.9)
    assert teams.get("search").ratios(clock()) == {"tokens": 1.0, "money": pytest.approx(1.0)}


def test_a_team_refusal_undoes_the_key_reservation_in_the_same_transaction(
    store: KeyStore, holder: HoldStore, teams: TeamStore, clock: ManualClock, db_url: str
) -> None:
    teams.create("small", DAY, quota_tokens=50)
    key, _ = store.create("both", quota_tokens=1000, quota_period_s=DAY, team="small")
    assert holder.reserve(key, 60, 0.0, clock()).team is not None
    assert store.get("both").quota_used_at(clock()) == 0 and live_holds(db_url) == 0
    hold = held(holder, key, 40, clock())
    assert store.get("both").quota_used_at(clock()) == 40
    assert teams.get("small").used_at(clock()) == (40, 0.0)
    holder.settle(Charge(hold, 30, 0.0))
    assert store.get("both").quota_used_at(clock()) == 30 and live_holds(db_url) == 0


def test_a_new_team_period_starts_empty_and_an_old_hold_owes_it_nothing(
    store: KeyStore, holder: HoldStore, teams: TeamStore, clock: ManualClock
) -> None:
    teams.create("search", DAY, quota_tokens=100)
    key, _ = store.create("t", team="search")
    old = held(holder, key, 100, clock())
    assert holder.reserve(key, 1, 0.0, clock()).team is not None
    clock.advance(DAY)
    assert teams.get("search").used_at(clock()) == (0, 0.0)
    held(holder, key, 30, clock())
    holder.settle(Charge(old, 5, 0.0))  # yesterday's
    assert teams.get("search").used_at(clock()) == (30, 0.0)


def test_a_warn_only_team_counts_past_its_budget_and_a_plain_one_holds_nothing(
    store: KeyStore, holder: HoldStore, teams: TeamStore, clock: ManualClock
) -> None:
    teams.create("ml", DAY, budget=1.0, hard_stop=False)
    teams.create("plain", DAY)
    warn, _ = store.create("w", team="ml")
    for _ in range(3):
        held(holder, warn, 10, clock(), 0.5)
    assert teams.get("ml").ratios(clock()) == {"money": 1.5}
    for team in ("plain", "gone"):
        key, _ = store.create(f"k-{team}", team=team)
        reservation = holder.reserve(key, 10, 0.5, clock())
        assert not reservation.refused and reservation.hold is None
    assert teams.get("plain").used_at(clock()) == (0, 0.0)  # its usage is in the audit


def test_a_hold_is_settled_once_whether_the_gateway_or_its_audit_row_comes_first(
    store: KeyStore, holder: HoldStore, teams: TeamStore, clock: ManualClock, db_url: str
) -> None:
    teams.create("search", DAY, quota_tokens=1000, budget=1000.0)
    key, _ = store.create("k", quota_tokens=1000, quota_period_s=DAY, team="search")
    db = open_database(db_url)
    gateway_first, audit_first = (
        held(holder, key, 100, clock(), 100.0),
        held(holder, key, 100, clock(), 100.0),
    )
    holder.settle(Charge(gateway_first, 30, 30.0))
    rows = [
        {"hold": h, "prompt_tokens": 20, "completion_tokens": 10}
        for h in (gateway_first, audit_first)
    ]
    with db.begin() as conn:  # the audit writer's hook, as it commits both rows
        holder.settle_rows(conn, rows)
    holder.settle(Charge(audit_first, 30, 30.0))  # the gateway's own, after: nothing left
    assert store.get("k").quota_used_at(clock()) == 60
    assert teams.get("search").used_at(clock()) == (60, pytest.approx(60.0))
    assert live_holds(db_url) == 0


def test_a_dead_gateways_holds_are_returned_when_they_expire_and_a_late_charge_still_counts(
    store: KeyStore, holder: HoldStore, teams: TeamStore, clock: ManualClock, db_url: str
) -> None:
    teams.create("search", DAY, quota_tokens=1000)
    key, _ = store.create("k", quota_tokens=1000, quota_period_s=DAY, team="search")
    peer = HoldStore(open_database(db_url), PRICES, 10.0, clock)
    held(holder, key, 100, clock())  # its request dies with its gateway, as its audit row
    late = held(holder, key, 100, clock())
    kept = held(peer, key, 100, clock())
    clock.advance(9)
    peer.renew()
    assert peer.release_expired() == 0
    clock.advance(2)  # `holder` stopped renewing 11 s ago: its holds are past their expiry
    assert peer.release_expired() == 2
    assert peer.release_expired() == 0  # returned once
    assert store.get("k").quota_used_at(clock()) == 100
    holder.settle(Charge(late, 40, 0.0))  # its journal row, replayed after the restart
    assert store.get("k").quota_used_at(clock()) == 140
    assert teams.get("search").used_at(clock()) == (140, 0.0)
    peer.settle(Charge(kept, 50, 0.0))
    assert store.get("k").quota_used_at(clock()) == 90 and live_holds(db_url) == 0
    clock.advance(DAY + 20)
    peer.release_expired()
    with open_database(db_url).connect() as conn:  # released holds are forgotten in time
        assert conn.execute(select(func.count()).select_from(holds)).scalar_one() == 0
