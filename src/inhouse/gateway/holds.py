"""Holds: what an admitted request reserves of its key's token quota and of its team's
quota and money budget, held together in one transaction until the request settles.

A hold is a row (`db.holds`) beside the counters it adds to (`api_keys.quota_used`,
`teams.tokens_used`/`money_used`), written in the transaction that adds to them, so
`quota_used` and a team's usage are always the audit's charges plus the live holds:

- reserve: the key's and the team's conditional UPDATEs (row locks on PostgreSQL, key
  before team) and the hold's INSERT commit together or not at all;
- settle: deleting the hold and swapping its reservation for the real charge commit
  together; whoever deletes it (the gateway when the response ends, or the audit writer
  committing the request's journal row after a crash) settles it, exactly once;
- expire: a hold carries its owner (a random id per gateway process) and an expiry the
  owner renews every `ttl/3`; a hold past its expiry (its gateway died) is returned by
  whichever gateway sees it first and kept as `released`, so a late settlement (the dead
  gateway's journal replayed on its restart) adds the whole charge. Released holds are
  forgotten after `RELEASED_KEPT_S`.

Every transaction takes its locks in one order (holds, then keys by id, then teams by name).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Integer,
    Row,
    case,
    cast,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.exc import SQLAlchemyError

from inhouse.cost.settings import TokenPrices
from inhouse.gateway.config import DEFAULT_HOLD_TTL_S
from inhouse.gateway.db import api_keys, holds
from inhouse.gateway.keys import ApiKey
from inhouse.gateway.usage.teams import Team, add_in, reserve_in

log = logging.getLogger("inhouse.gateway.holds")

RELEASED_KEPT_S = 86400.0


@dataclass(frozen=True, slots=True)
class Reservation:
    """A reservation's outcome: the hold's id (None when nothing needed holding), or the
    refusal: the key's quota used so far, or the team as it stands."""

    hold: str | None = None
    key_used: int | None = None
    team: Team | None = None

    @property
    def refused(self) -> bool:
        return self.key_used is not None or self.team is not None


@dataclass(frozen=True, slots=True)
class Charge:
    """What a settled request really cost: tokens and money."""

    hold: str
    tokens: int
    money: float


class HoldStore:
    """Reserves, settles, renews and expires holds in the gateway database."""

    def __init__(
        self, db: Engine, prices: TokenPrices, ttl_s: float = DEFAULT_HOLD_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:  # fmt: skip
        self._db = db
        self._prices = prices
        self.ttl_s = ttl_s
        self._clock = clock
        self.owner = uuid.uuid4().hex

    def reserve(self, key: ApiKey, tokens: int, money: float, at: float) -> Reservation:
        """Hold `tokens` of the key's quota (if it has one) and `tokens` and `money` of its
        team's quota and budget (if it has them), all or nothing."""
        with self._db.connect() as conn, conn.begin() as tx:
            key_held = key.quota_tokens is not None
            if key_held and not _reserve_quota(conn, key.id, tokens, at):
                used = conn.execute(select(_quota_used(at)).where(api_keys.c.id == key.id))
                refusal = Reservation(key_used=int(used.scalar_one()))
                tx.rollback()
                return refusal
            team_held = False
            if key.team is not None:
                team_held, team = reserve_in(conn, key.team, tokens, money, at)
                if team is not None:
                    tx.rollback()
                    return Reservation(team=team)
            if not (key_held or team_held):
                return Reservation()
            hold = uuid.uuid4().hex
            conn.execute(
                insert(holds).values(
                    id=hold, owner=self.owner, expires_at=self._clock() + self.ttl_s, at=at,
                    key_id=key.id if key_held else None, team=key.team if team_held else None,
                    tokens=tokens, money=money if team_held else 0.0, released=False,
                )
            )  # fmt: skip
        return Reservation(hold=hold)

    def settle(self, charge: Charge) -> None:
        """Swap a hold for what its request really cost (nothing, if already settled)."""
        with self._db.begin() as conn:
            settle_in(conn, [charge])

    def settle_rows(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
        """Settle the holds of audit rows being committed in `conn` that are still held (their
        gateway died between journaling the row and settling): the audit writer's hook."""
        charges = [
            Charge(
                row["hold"],
                row["prompt_tokens"] + row["completion_tokens"],
                self._prices.of(row["prompt_tokens"], row["completion_tokens"]),
            )
            for row in rows
            if row.get("hold")
        ]
        if charges:
            settle_in(conn, charges)

    def renew(self) -> None:
        """Push this gateway's holds' expiry `ttl_s` ahead: they stay while it lives."""
        with self._db.begin() as conn:
            conn.execute(
                update(holds)
                .where(holds.c.owner == self.owner, holds.c.released.is_(False))
                .values(expires_at=self._clock() + self.ttl_s)
            )

    def release_expired(self) -> int:
        """Return every hold past its expiry (of any gateway) to its key and team, and
        forget released holds no settlement came for; the number returned."""
        now = self._clock()
        with self._db.begin() as conn:
            expired = conn.execute(
                update(holds)
                .where(holds.c.released.is_(False), holds.c.expires_at < now)
                .values(released=True)
                .returning(*holds.c)
            ).all()
            _add(conn, [(row, -row.tokens, -row.money) for row in expired])
            conn.execute(
                delete(holds).where(
                    holds.c.released.is_(True), holds.c.expires_at < now - RELEASED_KEPT_S
                )
            )
        return len(expired)

    async def run(self) -> None:
        """Renew this gateway's holds and return expired ones every `ttl_s / 3`."""
        while True:
            try:
                await asyncio.to_thread(self.renew)
                returned = await asyncio.to_thread(self.release_expired)
                if returned:
                    log.info("holds: returned %d expired hold(s) of stopped gateways", returned)
            except SQLAlchemyError as exc:
                log.error("holds: could not renew or expire holds (%s)", type(exc).__name__)
            await asyncio.sleep(self.ttl_s / 3)


def settle_in(conn: Connection, charges: Iterable[Charge]) -> None:
    """Delete the holds charged and add each one's charge less what it still held, in
    `conn`'s transaction; a hold already gone was settled by someone else."""
    by_hold = {c.hold: c for c in charges}
    done = conn.execute(
        delete(holds).where(holds.c.id.in_(sorted(by_hold))).returning(*holds.c)
    ).all()
    changes = []
    for row in done:
        charge = by_hold[row.id]
        held = (0, 0.0) if row.released else (row.tokens, row.money)
        changes.append((row, charge.tokens - held[0], charge.money - held[1]))
    _add(conn, changes)


def _add(conn: Connection, changes: list[tuple[Row[Any], int, float]]) -> None:
    """Add each hold's (tokens, money) change to its key's quota, then its team."""
    for row, tokens, _ in sorted(
        (c for c in changes if c[0].key_id is not None), key=lambda c: c[0].key_id
    ):
        used = api_keys.c.quota_used + tokens
        conn.execute(
            update(api_keys)
            .where(api_keys.c.id == row.key_id, api_keys.c.quota_window == _window(row.at))
            .values(quota_used=case((used < 0, 0), else_=used))
        )
    for row, tokens, money in sorted(
        (c for c in changes if c[0].team is not None), key=lambda c: c[0].team
    ):
        add_in(conn, row.team, row.at, tokens, money)


def _window(at: float) -> ColumnElement[int]:
    """The SQL for the index of the key's quota period containing `at` (0 without one)."""
    period = api_keys.c.quota_period_s
    return case(
        (or_(period.is_(None), period <= 0), 0),
        else_=cast(func.floor((at - api_keys.c.created_at) / period), Integer),
    )


def _quota_used(at: float) -> ColumnElement[int]:
    c = api_keys.c
    return case((c.quota_window == _window(at), c.quota_used), else_=0)


def _reserve_quota(conn: Connection, key_id: int, tokens: int, at: float) -> bool:
    """Add `tokens` to the key's quota period containing `at` if they fit (one conditional
    UPDATE: its row lock orders concurrent reservations on PostgreSQL)."""
    c = api_keys.c
    done = conn.execute(
        update(api_keys)
        .where(c.id == key_id, _quota_used(at) + tokens <= c.quota_tokens)
        .values(quota_used=_quota_used(at) + tokens, quota_window=_window(at))
    )
    return done.rowcount == 1
