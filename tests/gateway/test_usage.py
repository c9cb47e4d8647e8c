"""`inhouse usage` and `gateway.usage`: totals per person, team, model, release and day,
aggregated in a real SQLite file, as a table, JSON and CSV; `inhouse teams` and
`keys --team`."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import time
from pathlib import Path

import pytest
from sqlalchemy import delete, func, insert, select
from typer.testing import CliRunner

from inhouse.cli import app
from inhouse.cost.settings import TokenPrices
from inhouse.gateway.audit.writer import AuditRecord, AuditWriter, clean_row
from inhouse.gateway.config import AuditSettings
from inhouse.gateway.db import audit_log, schema_marks, usage_daily
from inhouse.gateway.db_open import open_database
from inhouse.gateway.usage.report import UnknownGrouping, usage
from inhouse.gateway.usage.rollup import BACKFILLED

DAY = 86400.0
NOW = time.time()


def _seed(db_url: str, journal: Path, backfilled: bool = False) -> None:
    """alice (search) 3 calls, one refused; bob (search) 1; carol (no team) 1 on another model,
    and one call of alice's 40 days ago (outside a 30-day report)."""
    records = [
        AuditRecord(NOW - 100, "alice", "smol", "chat/completions", 200, team="search",
                    prompt_tokens=1000, completion_tokens=300, release=2),
        AuditRecord(NOW - 90, "alice", "smol", "chat/completions", 200, team="search",
                    prompt_tokens=1000, completion_tokens=300, release=1),
        AuditRecord(NOW - 80, "alice", "smol", "chat/completions", 429, team="search"),
        AuditRecord(NOW - DAY - 10, "bob", "smol", "chat/completions", 200, team="search",
                    prompt_tokens=10, completion_tokens=5),
        AuditRecord(NOW - 50, "carol", "qwen", "chat/completions", 500, prompt_tokens=7),
        AuditRecord(NOW - 40 * DAY, "alice", "smol", "chat/completions", 200, team="search",
                    prompt_tokens=10**6, completion_tokens=10**6),
    ]  # fmt: skip
    db = open_database(db_url)
    if backfilled:  # rows already there when the rollup came: summed at the next open
        with db.begin() as conn:
            conn.execute(insert(audit_log), [clean_row(r) for r in records])
            conn.execute(delete(schema_marks).where(schema_marks.c.name == BACKFILLED))
    else:  # as the gateway writes them: journal, then rows and rollup in one transaction
        writer = AuditWriter(db, AuditSettings(), journal)
        for record in records:
            writer.record(record)
        asyncio.run(writer.flush())
    db.dispose()


@pytest.mark.parametrize("backfilled", [False, True])
def test_usage_per_person_team_model_release_and_day(
    db_url: str, tmp_path: Path, backfilled: bool
) -> None:
    _seed(db_url, tmp_path / "journal", backfilled)
    db = open_database(db_url)
    since = NOW - 30 * DAY
    prices = TokenPrices(0.3, 1.2)
    people = {r.group: r for r in usage(db, "person", since, prices=prices)}
    assert list(people) == ["alice", "bob", "carol"]  # most tokens first
    alice = people["alice"]
    assert (alice.requests, alice.errors, alice.prompt_tokens, alice.completion_tokens) == (
        3, 1, 2000, 600,
    )  # fmt: skip
    assert alice.cost == pytest.approx((2000 * 0.3 + 600 * 1.2) / 1e6)
    teams = {r.group: (r.requests, r.tokens) for r in usage(db, "team", since)}
    assert teams == {"search": (4, 2615), "-": (1, 7)}
    models = {r.group: r.requests for r in usage(db, "model", since)}
    assert models == {"smol": 4, "qwen": 1}
    releases = {r.group: r.requests for r in usage(db, "release", since)}
    assert releases == {"1": 1, "2": 1, "-": 3}  # "-": rows of no release
    days = usage(db, "day", NOW - 2 * DAY)
    assert [r.group for r in days] == sorted(r.group for r in days)
    assert sum(r.requests for r in days) == 5 and len(days) in (2, 3)
    assert sum(r.requests for r in usage(db, "person", NOW - 45 * DAY)) == 6
    with pytest.raises(UnknownGrouping):
        usage(db, "colour", since)
    summed = db.connect().execute(select(func.sum(usage_daily.c.requests))).scalar_one()
    assert summed == 6  # every row is in the rollup exactly once


def test_a_report_from_and_to_mid_day_adds_the_partial_days_from_the_rows(
    db_url: str, tmp_path: Path
) -> None:
    _seed(db_url, tmp_path / "journal")
    db = open_database(db_url)
    for since, until in ((NOW - 95, NOW), (NOW - 2 * DAY, NOW - 85), (NOW - 41 * DAY, NOW)):
        found = sum(r.requests for r in usage(db, "person", since, until))
        with db.connect() as conn:
            rows = conn.execute(
                select(func.count()).where(audit_log.c.ts >= since, audit_log.c.ts < until)
            ).scalar_one()
        assert found == rows


def test_inhouse_usage_prints_a_table_json_and_csv(db_url: str, tmp_path: Path) -> None:
    _seed(db_url, tmp_path / "journal")
    runner = CliRunner()
    db = ["--database", db_url]
    table = runner.invoke(app, ["usage", "--by", "team", "--since", "30d", *db])
    assert table.exit_code == 0, table.output
    assert "search" in table.stdout and "2615" in table.stdout
    as_json = runner.invoke(app, ["usage", "--by", "person", "--json", *db])
    assert as_json.exit_code == 0, as_json.output
    rows = {r["group"]: r for r in json.loads(as_json.stdout)["rows"]}
    assert rows["alice"]["tokens"] == 2600 and rows["carol"]["errors"] == 1
    as_csv = runner.invoke(app, ["usage", "--by", "model", "--csv", *db])
    assert as_csv.exit_code == 0, as_csv.output
    records = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert {r["group"]: int(r["requests"]) for r in records} == {"smol": 4, "qwen": 1}
    wrong = runner.invoke(app, ["usage", "--by", "colour", *db])
    assert wrong.exit_code != 0 and "person" in wrong.output


def test_teams_and_keys_with_a_team_from_the_command_line(db_url: str) -> None:
    runner = CliRunner()
    db = ["--database", db_url]
    made = runner.invoke(app, ["teams", "create", "search", "--quota-tokens", "1000",
                               "--budget", "5", "--period", "7d", *db])  # fmt: skip
    assert made.exit_code == 0, made.output
    assert runner.invoke(app, ["keys", "create", "alice", "--team", "search", *db]).exit_code == 0
    assert runner.invoke(app, ["keys", "create", "bob", "--team", "ml", *db]).exit_code == 0
    listed = runner.invoke(app, ["teams", "list", *db])
    assert "search" in listed.stdout and "0/1000" in listed.stdout and "ml" in listed.stdout
    soft = runner.invoke(app, ["teams", "update", "search", "--warn-only", "--budget", "0", *db])
    assert soft.exit_code == 0 and "budget, hard_stop" in soft.stdout
    assert runner.invoke(app, ["teams", "update", "nobody", "--budget", "1", *db]).exit_code == 1
    moved = runner.invoke(app, ["keys", "update", "bob", "--team", "none", "--admin", *db])
    assert moved.exit_code == 0 and "admin, team" in moved.stdout
    keys = runner.invoke(app, ["keys", "list", *db], env={"COLUMNS": "200"}).stdout
    assert "alice @search" in keys and "bob (admin)" in keys
