"""Audit log: one row per request, journaled before the response and inserted in batches
off the request path.

Rows never hold a key secret or an Authorization header; prompt and completion
text only for keys with `log_content`, and then redacted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    case,
    delete,
    func,
    insert,
    select,
)
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError

from inhouse.gateway.audit.journal import REJECTED, Journal, Segment
from inhouse.gateway.config import AuditSettings
from inhouse.gateway.db import audit_log, audit_segments
from inhouse.gateway.db_values import column_cleaners
from inhouse.gateway.usage import rollup

log = logging.getLogger("inhouse.gateway.audit")

SEGMENT_ROWS = 100_000
DEFAULT_REDACTIONS = (
    r"ih-[A-Za-z0-9_\-]{16,}",  # a gateway key, even glued to the word before it
    r"\bsk-[A-Za-z0-9_\-]{16,}",
    r"(?i)bearer\s+[A-Za-z0-9._\-]+",
    r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}",
    r"\+?\d[\d \-]{8,}\d",
)


@dataclass(slots=True)
class AuditRecord:
    """What the gateway knows about one finished (or refused) request."""

    ts: float
    key_name: str | None
    model: str | None
    endpoint: str
    status: int
    backend: str | None = None
    error_type: str | None = None
    stream: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reserved_tokens: int = 0
    latency_ms: float | None = None
    ttft_ms: float | None = None
    finish_reason: str | None = None
    fallback_used: bool = False
    prompt_text: str | None = None
    completion_text: str | None = None
    release: int | None = None
    json_valid: bool | None = None
    refusal: bool | None = None
    tool_calls_valid: bool | None = None
    team: str | None = None
    prompt_hash: str | None = None
    priority: str | None = None  # the class it ran at (None: refused before admission)
    degraded_from: str | None = None  # the model asked for, when a smaller one answered
    hold: str | None = None  # the hold its tokens were reserved under (`holds`)
    adapter: str | None = None  # the LoRA adapter asked for (`model` is its base)
    images: int | None = None  # image parts the request held (None: none, or refused before)


_COLUMNS = tuple(f.name for f in fields(AuditRecord))


MIN_SECRET_CHARS = 8  # a shorter "secret" would redact ordinary words, and guards nothing


class Redactor:
    """Replaces secrets and personal data in logged text with `[redacted]`: the default
    patterns, the configured ones, and each literal secret the gateway holds (`secrets`:
    backend keys, the pepper, the metrics token; those under `MIN_SECRET_CHARS` are left
    out)."""

    def __init__(self, extra_patterns: Iterable[str] = (), secrets: Iterable[str] = ()) -> None:
        held = sorted({s for s in secrets if len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True)
        literal = ["|".join(map(re.escape, held))] if held else []
        self._patterns = [re.compile(p) for p in (*literal, *DEFAULT_REDACTIONS, *extra_patterns)]

    def __call__(self, text: str) -> str:
        for pattern in self._patterns:
            text = pattern.sub("[redacted]", text)
        return text


class AuditWriter:
    """Journals each row before the response leaves, and inserts them in batches from a
    background task (see `journal`). A row the database refuses is logged once and set
    aside in the journal's `rejected.jsonl`; it never holds back the others. `on_commit`
    runs in each transaction that inserts rows, with them (it settles their holds). Rows wait in
    memory for at most two segments of `SEGMENT_ROWS`; older ones are read back from disk."""

    def __init__(
        self, db: Engine, settings: AuditSettings, journal_dir: Path,
        on_commit: Callable[[Connection, list[dict[str, Any]]], None] | None = None,
    ) -> None:  # fmt: skip
        self._db = db
        self._on_commit = on_commit
        self._settings = settings
        self._journal = Journal(journal_dir)
        self._waiting: deque[Segment] = deque()
        self._outage_logged = False
        self.set_aside = 0

    def record(self, row: AuditRecord) -> None:
        """Append the row to the journal; never blocks on the database."""
        self._journal.append(clean_row(row))

    def adopt_orphans(self) -> int:
        """Queue the segments of gateways that died; the number adopted."""
        orphans = list(self._journal.orphans())
        self._waiting.extend(orphans)
        return len(orphans)

    async def run(self) -> None:
        """Adopt orphaned segments, then flush every `flush_interval_s` until cancelled."""
        if self.adopt_orphans():
            log.info("audit: replaying %d journal segment(s) left by a stopped gateway",
                     len(self._waiting))  # fmt: skip
        while True:
            await self.flush()
            await asyncio.sleep(self._settings.flush_interval_s)

    async def flush(self) -> None:
        """Commit every closed segment (and the open one) while the database takes them."""
        if not self._waiting or self._journal.current.count >= SEGMENT_ROWS:
            segment = self._journal.rotate()
            if segment is not None:
                if self._waiting:
                    segment.rows = None  # read back from disk when its turn comes
                self._waiting.append(segment)
        while self._waiting:
            try:
                committed = await asyncio.to_thread(self._commit, self._waiting[0])
            except Exception as exc:  # the loop that writes every later row must go on
                log.error("audit: could not commit a journal segment (%s)", _reason(exc))
                return
            if not committed:
                return
            self._waiting.popleft()

    async def close(self) -> None:
        """Flush what can be flushed (on shutdown); what cannot stays in the journal."""
        await self.flush()
        if not self._waiting:
            self._journal.close()

    def _commit(self, segment: Segment) -> bool:
        """Insert a segment's rows with its name; False while the database is unreachable."""
        rows = segment.read_rows()
        try:
            with self._db.begin() as conn:
                conn.execute(insert(audit_segments), {"name": segment.name})
                for start in range(0, len(rows), self._settings.batch_size):
                    conn.execute(insert(audit_log), rows[start : start + self._settings.batch_size])
                rollup.add(conn, rows)
                self._committing(conn, rows)
        except OperationalError as exc:
            if not self._outage_logged:
                log.error("audit: database unavailable (%s); rows wait in the journal",
                          _reason(exc))  # fmt: skip
                self._outage_logged = True
            return False
        except IntegrityError:
            if not self._committed(segment.name):
                return self._commit_one_by_one(segment, rows)
        except Exception:
            return self._commit_one_by_one(segment, rows)
        self._outage_logged = False
        self._forget(segment)
        return True

    def _commit_one_by_one(self, segment: Segment, rows: list[dict[str, Any]]) -> bool:
        """Insert row by row, setting aside each row the database refuses."""
        for row in rows:
            try:
                with self._db.begin() as conn:
                    conn.execute(insert(audit_log), row)
                    rollup.add(conn, [row])
                    self._committing(conn, [row])
            except OperationalError:
                return False
            except Exception as exc:
                log.error("audit: a row could not be written (%s); set aside in %s",
                          _reason(exc), self._journal.directory / REJECTED)  # fmt: skip
                self._journal.set_aside(row)
                self.set_aside += 1
        with self._db.begin() as conn:
            conn.execute(insert(audit_segments), {"name": segment.name})
        self._forget(segment)
        return True

    def _committing(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        if self._on_commit is not None:
            self._on_commit(conn, rows)

    def _committed(self, name: str) -> bool:
        with self._db.connect() as conn:
            found = conn.execute(select(audit_segments).where(audit_segments.c.name == name))
            return found.first() is not None

    def _forget(self, segment: Segment) -> None:
        """Delete a committed segment's file, then its name (a name left behind is harmless)."""
        segment.remove()
        with contextlib.suppress(SQLAlchemyError), self._db.begin() as conn:
            conn.execute(delete(audit_segments).where(audit_segments.c.name == segment.name))


def clean_row(row: AuditRecord) -> dict[str, Any]:
    """The row's values as its columns can hold them (see `db_values`)."""
    return {name: clean(getattr(row, name)) for name, clean in _CLEANERS.items()}


def _reason(exc: BaseException) -> str:
    """The driver's error, without the statement or its parameters (which may hold text)."""
    orig = getattr(exc, "orig", None) or exc
    return f"{type(orig).__name__}: {str(orig).splitlines()[0][:200] if str(orig) else ''}"


_CLEANERS = column_cleaners(audit_log, _COLUMNS)


def recent_rows(db: Engine, limit: int = 20, key_name: str | None = None) -> list[dict[str, Any]]:
    """The newest audit rows, newest first."""
    query = select(audit_log).order_by(audit_log.c.id.desc()).limit(limit)
    if key_name is not None:
        query = query.where(audit_log.c.key_name == key_name)
    with db.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def totals_by_key(db: Engine, since: float | None = None) -> list[dict[str, Any]]:
    """Requests, errors and tokens per key name."""
    c = audit_log.c
    query = (
        select(
            c.key_name,
            func.count().label("requests"),
            func.sum(case((c.status >= 400, 1), else_=0)).label("errors"),
            func.sum(c.prompt_tokens).label("prompt_tokens"),
            func.sum(c.completion_tokens).label("completion_tokens"),
            func.sum(case((c.fallback_used, 1), else_=0)).label("fallbacks"),
        )
        .group_by(c.key_name)
        .order_by(c.key_name)
    )
    if since is not None:
        query = query.where(c.ts >= since)
    with db.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]
