"""Audit rows reach the database in batches; text is redacted; totals add up."""

from __future__ import annotations

import asyncio

from inhouse.gateway.audit import AuditRecord, AuditWriter, Redactor, recent_rows, totals_by_key
from inhouse.gateway.config import AuditSettings
from inhouse.gateway.db import open_database


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


def test_writer_batches_rows_and_totals_add_up(db_url: str) -> None:
    engine = open_database(db_url)
    writer = AuditWriter(engine, AuditSettings(batch_size=2))
    statuses = [("a", 200), ("a", 429), ("b", 200), ("a", 200), ("b", 503)]
    rows = [
        AuditRecord(ts=1.0 + i, key_name=name, model="m", endpoint="chat/completions",
                    status=status, prompt_tokens=10, completion_tokens=5)
        for i, (name, status) in enumerate(statuses)
    ]  # fmt: skip
    for row in rows:
        writer.record(row)
    assert recent_rows(engine) == []
    asyncio.run(writer.flush())
    newest = recent_rows(engine, limit=2)
    assert [r["status"] for r in newest] == [503, 200]
    totals = {t["key_name"]: t for t in totals_by_key(engine)}
    assert totals["a"]["requests"] == 3 and totals["a"]["errors"] == 1
    assert totals["b"]["prompt_tokens"] == 20 and totals["b"]["completion_tokens"] == 10
    assert [r["key_name"] for r in recent_rows(engine, key_name="b")] == ["b", "b"]
