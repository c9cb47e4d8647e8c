"""Teams: the 429 on the request path, and old databases brought up to the schema (their
reservations, periods and warn-only teams: `test_holds`)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from canned_upstream import USAGE, Canned

from inhouse.gateway.app import build_gateway, create_app
from inhouse.gateway.audit.writer import recent_rows
from inhouse.gateway.backends import HealthChecker
from inhouse.gateway.config_file import parse_config
from inhouse.gateway.db_open import open_database
from inhouse.gateway.keys import KeyStore

DAY = 86400.0
ManualClock = Any  # tests/gateway/conftest.py's clock fixture: call it, advance it


def test_a_database_from_before_teams_and_releases_gains_the_new_columns(tmp_path: Path) -> None:
    db_file = tmp_path / "old.db"
    old = sqlite3.connect(db_file)
    old.executescript(OLD_SCHEMA)
    old.execute(
        "INSERT INTO api_keys (name, key_hash, created_at, quota_window, quota_used,"
        " allow_fallback, log_content) VALUES ('old', 'h', 1.0, 0, 0, 1, 0)"
    )
    old.execute("INSERT INTO audit_log (ts, key_name, status) VALUES (1.0, 'old', 200)")
    old.commit()
    old.close()
    store = KeyStore(open_database(f"sqlite:///{db_file}"), b"pepper")
    key = store.get("old")
    assert (key.team, key.admin) == (None, False)
    columns = {row[1] for row in sqlite3.connect(db_file).execute("PRAGMA table_info(audit_log)")}
    assert {
        "team",
        "prompt_hash",
        "release",
        "json_valid",
        "refusal",
        "tool_calls_valid",
    } <= columns
    added = "SELECT key_name, team, prompt_hash, release, json_valid, refusal FROM audit_log"
    assert sqlite3.connect(db_file).execute(added).fetchall() == [("old", *[None] * 5)]
    indexes = {row[1] for row in sqlite3.connect(db_file).execute("PRAGMA index_list(audit_log)")}
    assert {"ix_audit_usage", "ix_audit_retry"} <= indexes
    open_database(f"sqlite:///{db_file}").dispose()  # a second start finds nothing to add


# The two tables as the first release created them (before team, admin, prompt_hash,
# release and the answer checks).
OLD_SCHEMA = """
CREATE TABLE api_keys (id INTEGER PRIMARY KEY, name VARCHAR(200) NOT NULL UNIQUE,
  key_hash VARCHAR(64) NOT NULL UNIQUE, created_at FLOAT NOT NULL, expires_at FLOAT,
  revoked_at FLOAT, rpm INTEGER, tpm INTEGER, max_concurrent INTEGER, quota_tokens INTEGER,
  quota_period_s FLOAT, quota_window INTEGER NOT NULL, quota_used INTEGER NOT NULL,
  models TEXT, allow_fallback BOOLEAN NOT NULL, log_content BOOLEAN NOT NULL);
CREATE TABLE audit_log (id INTEGER PRIMARY KEY, ts FLOAT NOT NULL, key_name VARCHAR(200),
  model VARCHAR(200), endpoint VARCHAR(64), backend VARCHAR(200), status INTEGER NOT NULL,
  error_type VARCHAR(64), stream BOOLEAN NOT NULL DEFAULT 0,
  prompt_tokens INTEGER NOT NULL DEFAULT 0, completion_tokens INTEGER NOT NULL DEFAULT 0,
  reserved_tokens INTEGER NOT NULL DEFAULT 0, latency_ms FLOAT, ttft_ms FLOAT,
  finish_reason VARCHAR(32), fallback_used BOOLEAN NOT NULL DEFAULT 0, prompt_text TEXT,
  completion_text TEXT);
"""


HELLO = [{"role": "user", "content": "hello"}]


def test_keys_of_a_team_share_its_budget_and_get_429_insufficient_quota(
    tmp_path: Path, canned: Canned
) -> None:
    db_url = f"sqlite:///{tmp_path / 'gateway.db'}"
    backend = {"name": "r1", "url": canned.url, "model": "up", "kind": "vllm"}
    config = parse_config(
        {
            "gateway": {"database": db_url},
            "models": [{"name": "m", "backends": [backend], "default_max_tokens": 10}],
            "cost": {"hosted": {"input_per_million": 1e5, "output_per_million": 1e5}},
        }
    )
    gateway = build_gateway(config)
    # Each call reserves (its prompt estimate + 10) tokens, 0.1 a token, and is charged
    # USAGE (11 tokens, 1.1): a budget of 3.0 admits two calls, then refuses.
    gateway.teams.create("search", DAY, budget=3.0)
    alice = gateway.keys.create("alice", team="search")[1]
    bob = gateway.keys.create("bob", team="search")[1]

    async def main() -> list[int]:
        async with httpx.AsyncClient() as health:
            await HealthChecker(
                gateway.router.all_backends, health, config.health, lambda _: None
            ).check_all()
        transport = httpx.ASGITransport(create_app(gateway))
        statuses = []
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
            for secret in (alice, bob, alice, bob):
                client = openai.AsyncOpenAI(
                    base_url="http://gw/v1", api_key=secret, http_client=http, max_retries=0
                )
                try:
                    await client.chat.completions.create(model="m", messages=HELLO)
                    statuses.append(200)
                except openai.RateLimitError as err:
                    assert err.code == "insufficient_quota" and "team 'search'" in err.message
                    statuses.append(429)
                await gateway.drain()
        await gateway.audit.flush()
        return statuses

    assert asyncio.run(main()) == [200, 200, 429, 429]
    assert gateway.teams.get("search").used_at(gateway.teams.get("search").created_at) == (
        2 * USAGE["total_tokens"],
        pytest.approx(2.2),
    )
    rows = recent_rows(open_database(db_url), 10)
    assert {r["team"] for r in rows} == {"search"}
    hashes = {r["prompt_hash"] for r in rows if r["status"] == 200}
    assert len(hashes) == 1 and len(hashes.pop()) == 64  # same prompt, same hash, no text
