"""Audit log: one row per request, written in batches off the request path.

Rows never hold a key secret or an Authorization header; prompt and completion
text only for keys with `log_content`, and then redacted.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy import Engine, case, func, insert, select

from inhouse.gateway.config import AuditSettings
from inhouse.gateway.db import audit_log

log = logging.getLogger("inhouse.gateway.audit")

MAX_PENDING = 100_000
DEFAULT_REDACTIONS = (
    r"\b(?:ih|sk)-[A-Za-z0-9_\-]{16,}",
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


_COLUMNS = tuple(f.name for f in fields(AuditRecord))


class Redactor:
    """Replaces secrets and personal data in logged text with `[redacted]`."""

    def __init__(self, extra_patterns: Iterable[str] = ()) -> None:
        self._patterns = [re.compile(p) for p in (*DEFAULT_REDACTIONS, *extra_patterns)]

    def __call__(self, text: str) -> str:
        for pattern in self._patterns:
            text = pattern.sub("[redacted]", text)
        return text


class AuditWriter:
    """Buffers records and inserts them in batches from a background task."""

    def __init__(self, engine: Engine, settings: AuditSettings) -> None:
        self._engine = engine
        self._settings = settings
        self._pending: list[AuditRecord] = []
        self.dropped = 0

    def record(self, row: AuditRecord) -> None:
        """Queue a row; never blocks the request."""
        if len(self._pending) >= MAX_PENDING:
            self.dropped += 1
            return
        self._pending.append(row)

    async def run(self) -> None:
        """Flush every `flush_interval_s` until cancelled."""
        while True:
            await asyncio.sleep(self._settings.flush_interval_s)
            await self.flush()

    async def flush(self) -> None:
        while self._pending:
            batch = self._pending[: self._settings.batch_size]
            del self._pending[: len(batch)]
            try:
                await asyncio.to_thread(self._insert, batch)
            except Exception:
                log.exception("audit: could not write %d rows; keeping them for retry", len(batch))
                self._pending[:0] = batch
                return

    def _insert(self, batch: list[AuditRecord]) -> None:
        # Plain dicts: dataclasses.asdict deep-copies and cost twice the INSERT itself.
        rows = [{name: getattr(r, name) for name in _COLUMNS} for r in batch]
        with self._engine.begin() as conn:
            conn.execute(insert(audit_log), rows)


def recent_rows(
    engine: Engine, limit: int = 20, key_name: str | None = None
) -> list[dict[str, Any]]:
    """The newest audit rows, newest first."""
    query = select(audit_log).order_by(audit_log.c.id.desc()).limit(limit)
    if key_name is not None:
        query = query.where(audit_log.c.key_name == key_name)
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def totals_by_key(engine: Engine, since: float | None = None) -> list[dict[str, Any]]:
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
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]
