"""Two gateway replicas on one real PostgreSQL: keys, revocation, token quotas, shared RPM
and audit hold across processes.

One `inhouse serve` (the bundled model), PostgreSQL started by pgserver, and two
`inhouse gateway` processes on different ports with the same database URL, the same
pepper and `shared_limits = true`; the official client talks to both.
"""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from sqlalchemy import create_engine, text

from inhouse.gateway.config_file import load_config
from inhouse.gateway.db_open import open_database
from inhouse.gateway.keys import KeyStore, load_pepper
from inhouse.gateway.releases.store import BackendRef, NewRelease, ReleaseStore
from inhouse.gateway.usage.teams import TeamStore
from serving import (
    SERVE_KEY,
    Process,
    Served,
    audit_rows,
    burst,
    free_port,
    gateway_toml,
    inhouse_command,
)

pytest.importorskip("pgserver", reason="pip install -e '.[dev]' (pgserver)")
pytest.importorskip("psycopg", reason="pip install -e '.[dev]' (psycopg[binary])")
pytest.importorskip("inhouse.server.app", reason="inhouse serve is not importable")

pytestmark = pytest.mark.slow

UPSTREAM_MODEL = "SmolLM2-135M-Instruct"
HELLO = [{"role": "user", "content": "Say hello."}]


@dataclass
class Replicas:
    gateway_urls: list[str]
    store: KeyStore  # what gateway 0's config opens: its database URL and pepper
    db_url: str

    def key(self, name: str, **limits: Any) -> str:
        return self.store.create(name, **limits)[1]

    def client(self, replica: int, secret: str) -> openai.OpenAI:
        url = self.gateway_urls[replica]
        return openai.OpenAI(base_url=f"{url}/v1", api_key=secret, max_retries=0)


def _config(port: int, db_url: str, pepper: Path, backend_url: str, backend_key: str) -> str:
    backend = {
        "name": "b1", "url": backend_url, "api_key": backend_key, "model": UPSTREAM_MODEL,
        "capabilities": ["chat", "completions"], "max_context": 2048,
    }  # fmt: skip
    return gateway_toml(
        {"port": port, "database": db_url, "pepper_file": pepper, "shared_limits": True},
        [{"name": "smol", "backends": [backend]}],
        health={"interval_s": 2},
        audit={"flush_interval_s": 0.2},
        # a token costs 1: a team's money budget counts tokens
        cost={"hosted": {"input_per_million": 1e6, "output_per_million": 1e6}},
    )


def test_replicas_starting_together_on_an_empty_database_all_start(postgres: str) -> None:
    with create_engine(postgres, isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(text("CREATE DATABASE empty"))
    url = postgres.replace("/postgres?", "/empty?", 1)
    together = threading.Barrier(4)
    failures: list[Exception] = []

    def start() -> None:
        together.wait()
        try:
            open_database(url).dispose()
        except Exception as err:
            failures.append(err)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory, postgres: str, bundled_serve: Served
) -> Iterator[Replicas]:
    base = tmp_path_factory.mktemp("pg-replicas")
    pepper = base / "pepper"
    pepper.write_text(secrets.token_hex(32))
    ports = [free_port() for _ in range(2)]
    gateways = []
    for i, port in enumerate(ports):
        config = base / f"gateway-{i}.toml"
        config.write_text(_config(port, postgres, pepper, bundled_serve.url, SERVE_KEY))
        args = [*inhouse_command(), "gateway", "--config", str(config)]
        gateways.append(Process(args, base / f"gateway-{i}.log"))
    gateway_urls = [f"http://127.0.0.1:{port}" for port in ports]
    config = load_config(base / "gateway-0.toml")
    store = KeyStore(open_database(config.database), load_pepper(config))
    try:
        for proc in gateways:
            proc.start()
        for proc, url in zip(gateways, gateway_urls, strict=True):
            proc.wait_healthy(f"{url}/health", 60)
        yield Replicas(gateway_urls, store, postgres)
    finally:
        for proc in gateways:
            proc.stop()


def test_revocation_and_expiry_through_one_replica_apply_on_the_other(
    replicas: Replicas,
) -> None:
    secret = replicas.key("revoked")
    for replica in (0, 1):
        replicas.client(replica, secret).chat.completions.create(
            model="smol", messages=HELLO, max_tokens=1
        )
    replicas.store.revoke("revoked")
    with pytest.raises(openai.AuthenticationError, match="revoked"):
        replicas.client(1, secret).chat.completions.create(
            model="smol", messages=HELLO, max_tokens=1
        )
    expiring = replicas.key("expiring")
    replicas.client(1, expiring).models.list()
    replicas.store.update("expiring", expires_at=time.time())
    with pytest.raises(openai.AuthenticationError, match="expired"):
        replicas.client(1, expiring).models.list()


# A run of `=` is one token but estimated at 4 characters a token, and a short system
# message stops the template from adding its long default one: the reservation (estimate
# + max_tokens) covers the real usage of every request, so the quota bound below is sharp.
PADDED = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Say hello. " + "=" * 64},
]


def test_token_quota_is_never_oversubscribed_across_replicas(replicas: Replicas) -> None:
    quota = 400
    secret = replicas.key("quota", quota_tokens=quota, quota_period_s=86400)
    results: list[tuple[int, int, Any]] = []  # (replica, status, body)
    for _ in range(10):
        burst_results = burst(
            replicas.gateway_urls, secret, 8, model="smol", messages=PADDED, max_tokens=2
        )
        results += [(i % 2, status, body) for i, (status, _, body) in enumerate(burst_results)]
        if any(status != 200 for _, status, _ in results):
            break
    passed = [body for _, status, body in results if status == 200]
    refusals = {(status, body["code"]) for _, status, body in results if status != 200}
    assert refusals == {(429, "insufficient_quota")}, "the quota must run out, and only it"
    assert {replica for replica, status, _ in results if status == 200} == {0, 1}
    charged = sum(body.usage.total_tokens for body in passed)
    rows = audit_rows(replicas.db_url, "quota", len(results))
    assert len(rows) == len(results)
    rows = [r for r in rows if r["status"] == 200]
    assert len(rows) == len(passed)
    assert sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows) == charged
    # Admission reserves in SQL only if used + reservation <= quota, and used counts every
    # settled charge and every reservation still held. So when the last request was admitted,
    # the charges settled so far plus the reservations in flight fitted the quota; afterwards
    # only settlements change the total, each by (charged - reserved). The total can thus
    # exceed the quota by at most the sum of the positive overshoots of real usage over the
    # reservation, which PADDED makes zero: any excess would be an oversubscription.
    overshoot = sum(max(0, r["prompt_tokens"] + r["completion_tokens"] - r["reserved_tokens"])
                    for r in rows)  # fmt: skip
    assert overshoot == 0, "PADDED is meant to be reserved above its real usage"
    assert 0 < charged <= quota + overshoot
    deadline = time.monotonic() + 5
    while replicas.store.get("quota").quota_used != charged and time.monotonic() < deadline:
        time.sleep(0.1)
    assert replicas.store.get("quota").quota_used == charged


def test_requests_per_minute_are_shared_by_the_replicas(replicas: Replicas) -> None:
    rpm = 6
    secret = replicas.key("rpm", rpm=rpm)
    start = time.monotonic()
    results = burst(replicas.gateway_urls, secret, 16, model="smol", messages=HELLO, max_tokens=1)
    refill = math.floor((time.monotonic() - start) / (60 / rpm))
    passed = [r for r in results if r[0] == 200]
    limited = [r for r in results if r[0] == 429]
    assert rpm <= len(passed) <= rpm + refill and len(passed) + len(limited) == 16
    for _, headers, body in limited:
        assert body["type"] == "requests" and body["code"] == "rate_limit_exceeded"
        wait_ms = int(headers["retry-after-ms"])
        assert 0 < wait_ms <= 60_000 / rpm
        assert int(headers["retry-after"]) == math.ceil(wait_ms / 1000)
        assert headers["x-ratelimit-limit-requests"] == str(rpm)
        assert headers["x-ratelimit-remaining-requests"] == "0"
    assert {i % 2 for i, r in enumerate(results) if r[0] == 429} == {0, 1}


def test_audit_rows_of_both_replicas_land_in_the_one_database(replicas: Replicas) -> None:
    secret = replicas.key("audited", log_content=True)
    sent = []  # (prompt, prompt tokens, completion tokens) in request order
    for i in range(3):
        for replica in (0, 1):
            prompt = f"Request {i} through gateway {replica}."
            usage = (
                replicas.client(replica, secret)
                .chat.completions.create(
                    model="smol", messages=[{"role": "user", "content": prompt}], max_tokens=1 + i
                )
                .usage
            )
            sent.append((prompt, usage.prompt_tokens, usage.completion_tokens))
    rows = audit_rows(replicas.db_url, "audited", len(sent))
    time.sleep(0.5)  # two more flush intervals: a duplicate row would show up by now
    assert audit_rows(replicas.db_url, "audited", len(sent), timeout=0) == rows
    rows.sort(key=lambda r: r["ts"])
    assert len(rows) == len(sent)
    for row, (prompt, prompt_tokens, completion_tokens) in zip(rows, sent, strict=True):
        assert prompt in row["prompt_text"]
        assert (row["prompt_tokens"], row["completion_tokens"]) == (
            prompt_tokens,
            completion_tokens,
        )
        assert row["status"] == 200 and row["model"] == "smol" and row["backend"] == "b1"


def test_promote_and_rollback_apply_on_the_next_request_of_every_replica(
    replicas: Replicas,
) -> None:
    releases = ReleaseStore(open_database(replicas.db_url))
    first = NewRelease((BackendRef("b1"),))
    capped = NewRelease((BackendRef("b1"),), max_output=1)  # release 2: b1 capped at 1 token
    releases.canary("smol", first, capped, 0, 0, "test", "a one-token release")
    secret = replicas.key("release")

    def ask(replica: int) -> int:
        reply = replicas.client(replica, secret).chat.completions.create(
            model="smol", messages=HELLO, max_tokens=4
        )
        assert reply.usage is not None
        return reply.usage.completion_tokens

    assert ask(0) > 1 and ask(1) > 1  # release 1: up to 4 tokens
    releases.promote("smol", "test", None)  # through neither gateway: the database only
    assert [ask(1), ask(0)] == [1, 1]
    releases.rollback("smol", "test", None, to=1)
    assert ask(1) > 1
    rows = audit_rows(replicas.db_url, "release", 5)
    # each replica inserts its rows in its own batches: ids interleave, request times do not
    assert [r["release"] for r in sorted(rows, key=lambda r: r["ts"])] == [1, 1, 2, 2, 1]


def test_a_team_budget_is_never_oversubscribed_by_its_keys_across_replicas(
    replicas: Replicas,
) -> None:
    budget = 500.0
    TeamStore(open_database(replicas.db_url)).create("search", 86400, budget=budget)
    secrets_ = {name: replicas.key(name, team="search") for name in ("alice-t", "bob-t")}
    results: dict[str, list[tuple[int, int, Any]]] = {name: [] for name in secrets_}

    def hammer(name: str) -> None:  # each key: bursts of 8 across both replicas until refused
        for _ in range(10):
            out = burst(replicas.gateway_urls, secrets_[name], 8, model="smol",
                        messages=PADDED, max_tokens=2)  # fmt: skip
            results[name] += [(i % 2, status, body) for i, (status, _, body) in enumerate(out)]
            if any(status != 200 for _, status, _ in results[name]):
                return

    threads = [threading.Thread(target=hammer, args=(name,)) for name in secrets_]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [r for name in secrets_ for r in results[name]]
    refusals = {(status, body["code"]) for _, status, body in every if status != 200}
    assert refusals == {(429, "insufficient_quota")}, "the team budget must run out, and only it"
    assert {replica for replica, status, _ in every if status == 200} == {0, 1}
    rows = [
        row
        for name in secrets_
        for row in audit_rows(replicas.db_url, name, len(results[name]))
        if row["status"] == 200
    ]
    assert len(rows) == sum(status == 200 for _, status, _ in every)
    assert {row["team"] for row in rows} == {"search"}
    # As for a key's quota: every admission fitted charges + reservations in the budget, and
    # PADDED's reservation covers its real usage, so the charged total cannot exceed it.
    assert all(r["prompt_tokens"] + r["completion_tokens"] <= r["reserved_tokens"] for r in rows)
    charged = sum(row["prompt_tokens"] + row["completion_tokens"] for row in rows)
    assert budget / 2 < charged <= budget
    team = TeamStore(open_database(replicas.db_url)).get("search")
    assert team.used_at(time.time())[1] == pytest.approx(charged)
