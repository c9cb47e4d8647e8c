"""Audit rows reach the journal at once and the database in batches; a row the database
refuses is set aside without holding back the others; a dead gateway's journal is replayed
exactly once; text is redacted; totals add up."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

from sqlalchemy import insert

from inhouse.gateway.audit.journal import REJECTED
from inhouse.gateway.audit.writer import (
    AuditRecord,
    AuditWriter,
    Redactor,
    clean_row,
    recent_rows,
    totals_by_key,
)
from inhouse.gateway.config import AuditSettings
from inhouse.gateway.db import audit_log, audit_segments
from inhouse.gateway.db_open import open_database


def _row(i: int, name: str = "a", **fields: object) -> AuditRecord:
    values = {"model": "m", "status": 200, "prompt_tokens": 10, "completion_tokens": 5, **fields}
    return AuditRecord(ts=1.0 + i, key_name=name, endpoint="chat/completions", **values)  # type: ignore[arg-type]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_redactor_hides_keys_tokens_emails_and_numbers() -> None:
    redact = Redactor([r"project-\w+"])
    text = (
        "key ih-AbCdEfGhIjKlMnOpQrStUvWxYz012345 auth Bearer abc.def mail bob@example.com"
        " call +49 170 1234567 about project-zeus"
    )
    out = redact(text)
    for secret in ("ih-AbCd", "abc.def", "bob@example.com", "1234567", "zeus"):
        assert secret not in out
    assert out.count("[redacted]") == 5


def test_redactor_hides_every_secret_it_is_given_even_without_a_pattern() -> None:
    backend_key, pepper = "Zq8xW3vB9kLmN2pR", "4f1c2a9e8d7b6a5f"
    redact = Redactor(secrets=[backend_key, pepper, "short"])
    out = redact(f"k={backend_key}; p {pepper}; glued:xih-{'A' * 20} and short words")
    assert backend_key not in out and pepper not in out and "ih-AAAA" not in out
    assert "short words" in out  # a "secret" under 8 characters would redact ordinary text


def test_writer_batches_rows_and_totals_add_up(db_url: str) -> None:
    db = open_database(db_url)
    writer = AuditWriter(db, AuditSettings(batch_size=2), Path(db_url[10:] + ".audit"))
    statuses = [("a", 200), ("a", 429), ("b", 200), ("a", 200), ("b", 503)]
    rows = [
        AuditRecord(ts=1.0 + i, key_name=name, model="m", endpoint="chat/completions",
                    status=status, prompt_tokens=10, completion_tokens=5)
        for i, (name, status) in enumerate(statuses)
    ]  # fmt: skip
    for row in rows:
        writer.record(row)
    assert recent_rows(db) == []
    asyncio.run(writer.flush())
    newest = recent_rows(db, limit=2)
    assert [r["status"] for r in newest] == [503, 200]
    totals = {t["key_name"]: t for t in totals_by_key(db)}
    assert totals["a"]["requests"] == 3 and totals["a"]["errors"] == 1
    assert totals["b"]["prompt_tokens"] == 20 and totals["b"]["completion_tokens"] == 10
    assert [r["key_name"] for r in recent_rows(db, key_name="b")] == ["b", "b"]


def test_a_row_the_database_refuses_never_blocks_the_others(db_url: str, tmp_path: Path) -> None:
    db = open_database(db_url)
    writer = AuditWriter(db, AuditSettings(), tmp_path / "journal")
    huge = 9223372036854775808 * 2
    writer.record(_row(0, reserved_tokens=huge, latency_ms=float("nan"), model="m" * 5000))
    writer.record(_row(1, prompt_text="\udfff lone surrogate"))
    asyncio.run(writer.flush())
    first, second = recent_rows(db)[::-1]
    assert first["reserved_tokens"] == 2**63 - 1 and first["latency_ms"] is None
    assert len(first["model"]) == 200 and "\udfff" not in second["prompt_text"]
    bad = clean_row(_row(2))
    bad["key_name"] = object()  # a value no database driver can bind
    writer._journal.current.rows.append(bad)  # as if the journal held it
    writer._journal.current.count += 1
    for i in range(3, 6):
        writer.record(_row(i))
    asyncio.run(writer.flush())
    writer.record(_row(6))
    asyncio.run(writer.flush())
    assert [r["ts"] for r in recent_rows(db)][::-1] == [1.0, 2.0, 4.0, 5.0, 6.0, 7.0]
    assert writer.set_aside == 1
    assert (tmp_path / "journal" / REJECTED).exists()


def test_a_dead_gateways_journal_is_replayed_once(db_url: str, tmp_path: Path) -> None:
    db = open_database(db_url)
    journal = tmp_path / "journal"
    dead = AuditWriter(db, AuditSettings(), journal)
    for i in range(3):
        dead.record(_row(i))
    committed = AuditWriter(db, AuditSettings(), journal)
    committed.record(_row(3))
    segment = committed._journal.rotate()
    assert segment is not None
    with db.begin() as conn:  # its rows and name reached the database, then it died
        conn.execute(insert(audit_segments), {"name": segment.name})
        conn.execute(insert(audit_log), segment.rows)
    os.close(dead._journal.current.fd)  # the processes die: their locks go
    os.close(segment.fd)
    os.close(committed._journal.current.fd)
    lines = [json.loads(x) for x in dead._journal.current.path.read_text().splitlines()]
    assert [r["ts"] for r in lines] == [1.0, 2.0, 3.0]
    assert _mode(dead._journal.current.path) == 0o600 and _mode(journal) == 0o700

    heir = AuditWriter(db, AuditSettings(), journal)
    assert heir.adopt_orphans() == 3  # two segments of the dead, one committed but not deleted
    asyncio.run(heir.flush())
    assert sorted(r["ts"] for r in recent_rows(db)) == [1.0, 2.0, 3.0, 4.0]
    assert sorted(p.name for p in journal.iterdir()) == [heir._journal.current.path.name]
    assert AuditWriter(db, AuditSettings(), journal).adopt_orphans() == 0


def test_a_new_sqlite_database_is_readable_by_its_owner_only(db_url: str) -> None:
    open_database(db_url).dispose()
    assert _mode(Path(db_url.removeprefix("sqlite:///"))) == 0o600
