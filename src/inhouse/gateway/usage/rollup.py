"""The daily usage rollup: audit rows summed per UTC day, key, team and model.

It is written in the same transaction as the rows it sums (`AuditWriter._commit`), whose
segment name makes the insert happen once, so the rollup never counts a row twice or
misses one. A database that had audit rows before the rollup existed is summed once when
it is opened (`backfill`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, Engine, Integer, case, cast, func, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from inhouse.gateway.db import audit_log, schema_marks, usage_daily

DAY_S = 86400
KEYS = ("day", "key_name", "team", "model")
SUMS = ("requests", "errors", "prompt_tokens", "completion_tokens", "images")
BACKFILLED = "usage-rollup-backfilled"  # in schema_marks once the backfill ran
DIALECTS = {"sqlite": sqlite.insert, "postgresql": postgresql.insert}


def supported(db: Engine | Connection) -> bool:
    """Whether this database keeps the rollup (an upsert is dialect-specific)."""
    return db.dialect.name in DIALECTS


def summed(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Audit rows (as inserted) summed per rollup key."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for row in rows:
        ts = row.get("ts")
        if not isinstance(ts, float | int):
            continue
        key = (int(ts // DAY_S), row.get("key_name") or "", row.get("team") or "",
               row.get("model") or "")  # fmt: skip
        sums = groups.setdefault(key, [0, 0, 0, 0, 0])
        sums[0] += 1
        sums[1] += int((row.get("status") or 0) >= 400)
        sums[2] += row.get("prompt_tokens") or 0
        sums[3] += row.get("completion_tokens") or 0
        sums[4] += row.get("images") or 0
    return [dict(zip(KEYS + SUMS, (*k, *v), strict=True)) for k, v in groups.items()]


def add(conn: Connection, rows: Iterable[dict[str, Any]]) -> None:
    """Add audit rows to the rollup, in the caller's transaction."""
    if not supported(conn):
        return
    values = summed(rows)
    if not values:
        return
    statement = DIALECTS[conn.dialect.name](usage_daily)
    excluded = statement.excluded
    statement = statement.on_conflict_do_update(
        index_elements=list(KEYS),
        set_={name: func.coalesce(usage_daily.c[name], 0) + excluded[name] for name in SUMS},
    )
    conn.execute(statement, values)


def backfill(db: Engine) -> None:
    """Sum the audit rows already there into the rollup, once per database (a replica that
    loses the race to mark it done rolls its own sums back)."""
    if not supported(db):
        return
    with db.connect() as conn:
        done = conn.execute(select(schema_marks).where(schema_marks.c.name == BACKFILLED))
        if done.first() is not None:
            return
    c = audit_log.c
    day = cast(func.floor(c.ts / DAY_S), Integer)
    keys = (day, *(func.coalesce(column, "") for column in (c.key_name, c.team, c.model)))
    grouped = select(
        *keys, func.count(), func.sum(case((c.status >= 400, 1), else_=0)),
        func.sum(c.prompt_tokens), func.sum(c.completion_tokens), func.sum(c.images),
    ).group_by(*keys)  # fmt: skip
    try:
        with db.begin() as conn:
            conn.execute(insert(schema_marks), {"name": BACKFILLED})
            conn.execute(usage_daily.delete())
            conn.execute(insert(usage_daily).from_select(list(KEYS + SUMS), grouped))
    except IntegrityError:
        return
