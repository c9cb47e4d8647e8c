"""Usage aggregated in the database from the audit rows: requests, errors and tokens per
person (key), team, model, release, LoRA adapter or UTC day over a time range, with what
they cost at the `[cost]` charge prices, summed in SQL (the daily `rollup` for whole days);
rows never leave the database one by one."""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
import time
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Engine, Integer, case, cast, func, select

from inhouse.cost.settings import TokenPrices
from inhouse.gateway.db import audit_log, usage_daily
from inhouse.gateway.usage import rollup

DAY_S = 86400


class UnknownGrouping(ValueError):
    """A `by` this database cannot group on."""


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One group's totals over the range."""

    group: str
    requests: int
    errors: int
    prompt_tokens: int
    completion_tokens: int
    images: int
    cost: float

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


GROUPINGS = ("person", "team", "model", "release", "adapter", "day")
AUDIT_ONLY = ("release", "adapter")  # not in the daily rollup: summed from the audit rows


def usage(
    db: Engine,
    by: str,
    since: float,
    until: float | None = None,
    prices: TokenPrices | None = None,
    only: dict[str, str] | None = None,
) -> list[UsageRow]:
    """Totals per group of the audit rows with `since <= ts < until` (now), largest first.

    Whole UTC days are read from the daily rollup, the partial days at either end from the
    audit rows themselves (a range scan over the covering index); grouping by release or
    adapter (base-model requests are the adapter "-"), or a database without the rollup,
    reads the audit rows only. `only` keeps the rows of one
    person and/or team ({"person": "alice"})."""
    if by not in GROUPINGS:
        raise UnknownGrouping(f"cannot group usage by {by!r}: use one of {', '.join(GROUPINGS)}")
    until = time.time() if until is None else until
    first = math.ceil(since / rollup.DAY_S)
    last = math.floor(until / rollup.DAY_S)
    if by in AUDIT_ONLY or not rollup.supported(db) or first >= last:
        parts = [_from_audit(db, by, since, until, only)]
    else:
        parts = [
            _from_audit(db, by, since, first * rollup.DAY_S, only),
            _from_rollup(db, by, first, last, only),
            _from_audit(db, by, last * rollup.DAY_S, until, only),
        ]
    totals: dict[str, list[int]] = {}
    for part in parts:
        for group, *sums in part:
            into = totals.setdefault(_label(by, group), [0, 0, 0, 0, 0])
            for i, value in enumerate(sums):
                into[i] += int(value or 0)
    prices = prices or TokenPrices()
    rows = [
        UsageRow(group, *sums, cost=prices.of(sums[2], sums[3]))  # type: ignore[misc]
        for group, sums in totals.items()
    ]
    if by == "day":
        return sorted(rows, key=lambda r: r.group)
    return sorted(rows, key=lambda r: (-r.tokens, r.group))


def _sums(c: Any, requests: Any, errors: Any) -> tuple[Any, ...]:
    return (
        requests,
        errors,
        func.coalesce(func.sum(c.prompt_tokens), 0),
        func.coalesce(func.sum(c.completion_tokens), 0),
        func.coalesce(func.sum(c.images), 0),
    )


def _filters(c: Any, only: dict[str, str] | None) -> list[Any]:
    only = only or {}
    unknown = set(only) - {"person", "team"}
    if unknown:
        raise UnknownGrouping(f"usage can be narrowed to a person or team, not {unknown}")
    columns = {"person": c.key_name, "team": c.team}
    return [columns[field] == value for field, value in only.items()]


def _from_audit(
    db: Engine, by: str, since: float, until: float, only: dict[str, str] | None = None
) -> list[Any]:
    if since >= until:
        return []
    c = audit_log.c
    columns = {
        "person": c.key_name, "team": c.team, "model": c.model,
        "release": c.release, "adapter": c.adapter,
        "day": cast(func.floor(c.ts / DAY_S), Integer),
    }  # fmt: skip
    group = columns[by]
    errors = func.sum(case((c.status >= 400, 1), else_=0))
    query = (
        select(group, *_sums(c, func.count(), errors))
        .where(c.ts >= since, c.ts < until, *_filters(c, only))
        .group_by(group)
        # SQLite's planner prefers a skip-scan of the retry index, which is not covering.
        .with_hint(audit_log, "INDEXED BY ix_audit_usage", "sqlite")
    )
    with db.connect() as conn:
        return list(conn.execute(query).all())


def _from_rollup(
    db: Engine, by: str, first_day: int, last_day: int, only: dict[str, str] | None
) -> list[Any]:
    c = usage_daily.c
    columns = {"person": c.key_name, "team": c.team, "model": c.model, "day": c.day}
    group = columns[by]
    query = (
        select(group, *_sums(c, func.sum(c.requests), func.sum(c.errors)))
        .where(c.day >= first_day, c.day < last_day, *_filters(c, only))
        .group_by(group)
    )
    with db.connect() as conn:
        return list(conn.execute(query).all())


def _label(by: str, value: Any) -> str:
    if value is None or value == "":
        return "-"
    if by == "day":
        return dt.datetime.fromtimestamp(int(value) * DAY_S, dt.UTC).strftime("%Y-%m-%d")
    return str(value)


COLUMNS = (
    "group", "requests", "errors", "prompt_tokens", "completion_tokens", "tokens", "images", "cost",
)  # fmt: skip


def as_records(rows: list[UsageRow]) -> list[dict[str, Any]]:
    """Rows as plain dicts (JSON), `tokens` included."""
    return [{**asdict(r), "tokens": r.tokens} for r in rows]


def as_csv(rows: list[UsageRow]) -> str:
    """Rows as CSV with a header line."""
    out = io.StringIO()
    writer = csv.DictWriter(out, COLUMNS, lineterminator="\n")
    writer.writeheader()
    for record in as_records(rows):
        writer.writerow({**record, "cost": f"{record['cost']:.6f}"})
    return out.getvalue()
