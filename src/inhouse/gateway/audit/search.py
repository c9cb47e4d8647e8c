"""Searching the audit: rows by key, team, model, status and time range, newest first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, select

from inhouse.gateway.db import audit_log

MAX_ROWS = 500


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """What to look for; None matches anything."""

    key_name: str | None = None
    team: str | None = None
    model: str | None = None
    status: int | None = None
    since: float | None = None
    until: float | None = None
    limit: int = 100


def search(db: Engine, query: AuditQuery) -> list[dict[str, Any]]:
    """The newest matching rows (at most MAX_ROWS); text columns only where the key had
    `log_content` when the row was written (otherwise they were never stored)."""
    c = audit_log.c
    matches = (
        (c.key_name, query.key_name),
        (c.team, query.team),
        (c.model, query.model),
        (c.status, query.status),
    )
    conditions = [column == value for column, value in matches if value is not None]
    if query.since is not None:
        conditions.append(c.ts >= query.since)
    if query.until is not None:
        conditions.append(c.ts < query.until)
    limit = max(1, min(query.limit, MAX_ROWS))
    statement = select(audit_log).where(*conditions).order_by(c.id.desc()).limit(limit)
    with db.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(statement)]
