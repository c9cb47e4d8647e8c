"""Teams: a token quota and a money budget per period, shared by the team's keys.

Both are reserved in SQL with the key's quota, in one transaction (`holds`): one
conditional UPDATE admits a request only if what the period has used and reserved, plus
this request's reservation, fits; settlement swaps the reservation for the real charge.
The state lives in the database row, so every replica sharing it sees one budget and the
team is never oversubscribed. A team without `hard_stop` is counted the same way but never
refuses (its budget only warns, see `budget_ratios`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Integer,
    and_,
    case,
    cast,
    func,
    insert,
    or_,
    select,
    update,
)

from inhouse.gateway.db import teams
from inhouse.gateway.limits import Admission
from inhouse.gateway.name_lists import decode, encode

DEFAULT_PERIOD_S = 30 * 86400.0
EDITABLE = frozenset({"period_s", "quota_tokens", "budget", "hard_stop", "adapters"})


class UnknownTeam(LookupError):
    """No team with that name."""


@dataclass(frozen=True, slots=True)
class Team:
    """One team's limits and what its current period has used (with reservations)."""

    name: str
    created_at: float
    period_s: float
    quota_tokens: int | None
    budget: float | None
    hard_stop: bool
    window: int
    tokens_used: int
    money_used: float
    adapters: frozenset[str] | None = None  # the LoRA adapters its keys may use (None: all)

    def window_at(self, now: float) -> int:
        """Index of the period containing `now` (periods start at the team's creation)."""
        return int((now - self.created_at) // self.period_s)

    def reset_at(self, now: float) -> float:
        return self.created_at + (self.window_at(now) + 1) * self.period_s

    def used_at(self, now: float) -> tuple[int, float]:
        """Tokens and money charged (or reserved) in the period containing `now`."""
        if self.window != self.window_at(now):
            return 0, 0.0
        return self.tokens_used, self.money_used

    def ratios(self, now: float) -> dict[str, float]:
        """Used / limit for each limit the team has ("tokens", "money")."""
        tokens, money = self.used_at(now)
        out = {}
        if self.quota_tokens:
            out["tokens"] = tokens / self.quota_tokens
        if self.budget:
            out["money"] = money / self.budget
        return out


class TeamStore:
    """Create, list and update teams (`holds` reserves and settles what they share)."""

    def __init__(self, db: Engine, clock: Callable[[], float] = time.time) -> None:
        self._db = db
        self._clock = clock

    def create(self, name: str, period_s: float = DEFAULT_PERIOD_S, **limits: Any) -> Team:
        _check(limits)
        if period_s <= 0:
            raise ValueError("a team's period must be > 0 seconds")
        if self.find(name) is not None:
            raise ValueError(f"a team named {name!r} already exists")
        values = {"hard_stop": True, **_encode(limits)}
        with self._db.begin() as conn:
            conn.execute(
                insert(teams).values(
                    name=name, created_at=self._clock(), period_s=period_s, window=0,
                    tokens_used=0, money_used=0.0, **values,
                )
            )  # fmt: skip
        return self.get(name)

    def ensure(self, name: str) -> Team:
        """The team named `name`, created without limits if it does not exist."""
        found = self.find(name)
        return found if found is not None else self.create(name)

    def find(self, name: str) -> Team | None:
        with self._db.connect() as conn:
            row = conn.execute(select(teams).where(teams.c.name == name)).first()
        return None if row is None else _decode(row._mapping)

    def get(self, name: str) -> Team:
        team = self.find(name)
        if team is None:
            raise UnknownTeam(f"no team named {name!r}")
        return team

    def list(self) -> list[Team]:
        with self._db.connect() as conn:
            rows = conn.execute(select(teams).order_by(teams.c.name)).all()
        return [_decode(r._mapping) for r in rows]

    def update(self, name: str, **changes: Any) -> Team:
        _check(changes)
        with self._db.begin() as conn:
            done = conn.execute(
                update(teams).where(teams.c.name == name).values(**_encode(changes))
            )
        if done.rowcount == 0:
            raise UnknownTeam(f"no team named {name!r}")
        return self.get(name)


def reserve_in(
    conn: Connection, name: str, tokens: int, money: float, at: float
) -> tuple[bool, Team | None]:
    """Hold `tokens` and `money` in the period containing `at`, in `conn`'s transaction:
    one conditional UPDATE, so the row lock orders concurrent reservations on PostgreSQL.

    (True, None) when held; (False, None) when nothing is to be held (the team has
    neither quota nor budget, or is gone: its usage is in the audit all the same);
    (False, team) when refused, with the team as it stands to word the refusal. A team
    without `hard_stop` always holds."""
    c = teams.c
    current = _window_expr(at)
    tokens_used = case((c.window == current, c.tokens_used), else_=0)
    money_used = case((c.window == current, c.money_used), else_=0.0)
    limited = or_(c.quota_tokens.is_not(None), c.budget.is_not(None))
    fits = and_(
        or_(c.quota_tokens.is_(None), tokens_used + tokens <= c.quota_tokens),
        or_(c.budget.is_(None), money_used + money <= c.budget),
    )
    done = conn.execute(
        update(teams)
        .where(c.name == name, limited, or_(c.hard_stop.is_(False), fits))
        .values(tokens_used=tokens_used + tokens, money_used=money_used + money, window=current)
    )
    if done.rowcount == 1:
        return True, None
    row = conn.execute(select(teams).where(c.name == name)).first()
    team = None if row is None else _decode(row._mapping)
    if team is None or (team.quota_tokens is None and team.budget is None):
        return False, None
    return False, team


def add_in(conn: Connection, name: str, at: float, tokens: int, money: float) -> None:
    """Add `tokens` and `money` (negative: return them) to the period containing `at`, in
    `conn`'s transaction, never below 0; a period that rolled over meanwhile was reset, so
    nothing is owed to it."""
    c = teams.c
    new_tokens = c.tokens_used + tokens
    new_money = c.money_used + money
    conn.execute(
        update(teams)
        .where(c.name == name, c.window == _window_expr(at))
        .values(
            tokens_used=case((new_tokens < 0, 0), else_=new_tokens),
            money_used=case((new_money < 0, 0.0), else_=new_money),
        )
    )


def _window_expr(at: float) -> ColumnElement[int]:
    """The SQL for the index of the period containing `at`, per team row."""
    c = teams.c
    return cast(func.floor((at - c.created_at) / c.period_s), Integer)


_FIELDS = tuple(f.name for f in fields(Team))


def _check(values: dict[str, Any]) -> None:
    unknown = set(values) - EDITABLE
    if unknown:
        raise TypeError(f"not a team setting: {sorted(unknown)}")


def _encode(values: dict[str, Any]) -> dict[str, Any]:
    if "adapters" not in values:
        return values
    return {**values, "adapters": encode(values["adapters"])}


def _decode(row: Any) -> Team:
    values = {name: row[name] for name in _FIELDS}
    values["adapters"] = decode(values["adapters"])
    values["hard_stop"] = bool(values["hard_stop"])
    values["money_used"] = float(values["money_used"] or 0.0)
    return Team(**values)


def team_exhausted(
    team: Team, hold: tuple[int, float], now: float, headers: dict[str, str]
) -> Admission:
    """The 429 `insufficient_quota` for a request its team's quota or budget cannot hold."""
    tokens, money = team.used_at(now)
    if team.quota_tokens is not None and tokens + hold[0] > team.quota_tokens:
        what = f"token quota: {tokens} of {team.quota_tokens} used, this request reserves {hold[0]}"
        never = hold[0] > team.quota_tokens
    else:
        assert team.budget is not None
        what = (
            f"budget: {money:.4f} of {team.budget:.4f} spent, this request may cost {hold[1]:.4f}"
        )
        never = hold[1] > team.budget
    return Admission(
        False,
        "insufficient_quota",
        None if never else team.reset_at(now) - now,
        f"team {team.name!r} has exhausted its {what}",
        headers,
    )
