"""Priority classes and degrade on the gateway's real objects: the queue's class order and
per-class waits (Router), the expected wait that decides degrading, what `prepare` sends
each backend kind, the config keys (and any value of them: ConfigError, nothing else), the
key's class in the store and the CLI, and old SQLite and PostgreSQL databases migrated."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ManualClock
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text
from test_console_security import _run, csrf_of, sign_in
from test_teams import OLD_SCHEMA
from typer.testing import CliRunner

from inhouse.cli import app
from inhouse.gateway.backends import BackendState
from inhouse.gateway.config import ConfigError, ModelRoute, Upstream
from inhouse.gateway.config_file import parse_config
from inhouse.gateway.db import metadata
from inhouse.gateway.db_open import open_database
from inhouse.gateway.degrade import expected_wait_s
from inhouse.gateway.exchange import prepare
from inhouse.gateway.handler import Gateway
from inhouse.gateway.keys import KeyStore
from inhouse.gateway.parsing import read_needs
from inhouse.gateway.routing import Overloaded, Router

NEEDS = read_needs("chat/completions", {"messages": [{"content": "hi"}], "max_tokens": 1})
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "priority": -1}


def _route(**waits: float) -> ModelRoute:
    backend = Upstream("b0", "http://127.0.0.1:9000", None, "m", max_in_flight=1)
    return ModelRoute("m", (backend,), class_max_wait_s=tuple(waits.items()))


def _router(route: ModelRoute, clock: ManualClock | None = None) -> Router:
    router = Router([route], health_interval_s=7.0, **({"clock": clock} if clock else {}))
    router.backends["m"][0].state = BackendState.UP
    return router


def test_the_queue_serves_interactive_then_default_then_batch_each_in_arrival_order() -> None:
    async def scenario() -> list[str]:
        route = _route()
        router = _router(route)
        held = await router.acquire(route, NEEDS, True)
        served: list[str] = []

        async def wait(name: str, priority: str) -> None:
            lease = await router.acquire(route, NEEDS, True, priority=priority)
            served.append(name)
            await asyncio.sleep(0)
            router.release(lease)

        tasks = []
        arrivals = [("b1", "batch"), ("d1", "default"), ("b2", "batch"), ("i1", "interactive"),
                    ("d2", "default"), ("i2", "interactive")]  # fmt: skip
        for name, priority in arrivals:
            tasks.append(asyncio.create_task(wait(name, priority)))
            await asyncio.sleep(0)
        assert router.queue_depth("m") == 6 and router.queue_depth("m", up_to_rank=0) == 2
        router.release(held)
        await asyncio.gather(*tasks)
        return served

    assert asyncio.run(scenario()) == ["i1", "i2", "d1", "d2", "b1", "b2"]


def test_each_class_waits_its_own_bound() -> None:
    async def scenario() -> tuple[bool, bool]:
        route = _route(interactive=0.05, batch=5.0)
        router = _router(route)
        held = await router.acquire(route, NEEDS, True)
        batch = asyncio.create_task(router.acquire(route, NEEDS, True, priority="batch"))
        with pytest.raises(Overloaded) as refused:
            await router.acquire(route, NEEDS, True, priority="interactive")
        assert refused.value.status_code == 429
        waiting = not batch.done()
        router.release(held)
        lease = await batch
        return waiting, lease.backend is router.backends["m"][0]

    assert asyncio.run(scenario()) == (True, True)
    assert _route(interactive=5).max_wait("batch") == 30.0  # unnamed: the default's


def test_a_request_that_waits_again_keeps_its_place_without_breaking_the_queue() -> None:
    """A wait that times out while the router's clock says time is left waits again at its
    place; its timed-out entry stays in the heap beside the new one (they once compared
    their futures: TypeError, a 500 when all replicas were down)."""

    class SlowClock:
        """Stands still for 5 readings, then jumps 10 s: a wait times out before its deadline."""

        def __init__(self) -> None:
            self.readings = 0

        def __call__(self) -> float:
            self.readings += 1
            return 100.0 + 10.0 * (self.readings // 6)

    async def scenario() -> int:
        route = _route(interactive=0.05)
        router = Router([route], health_interval_s=7.0, clock=SlowClock())
        router.backends["m"][0].state = BackendState.UP
        held = await router.acquire(route, NEEDS, True)
        with pytest.raises(Overloaded) as refused:
            await router.acquire(route, NEEDS, True, priority="interactive")
        router.release(held)
        return refused.value.status_code

    assert asyncio.run(scenario()) == 429


def test_the_expected_wait_is_the_queue_ahead_times_the_recent_time_per_call() -> None:
    async def scenario() -> None:
        clock = ManualClock(100.0)
        route = _route()
        router = _router(route, clock)
        assert expected_wait_s(router, route, NEEDS, "interactive") == 0.0  # a slot is free
        first = await router.acquire(route, NEEDS, True)
        clock.advance(4.0)  # nothing has ended yet: the running call's age
        assert expected_wait_s(router, route, NEEDS, "interactive") == 4.0
        router.release(first)
        assert router.recent_service_s("m") == 4.0
        await router.acquire(route, NEEDS, True)
        batch = asyncio.create_task(router.acquire(route, NEEDS, True, priority="batch"))
        await asyncio.sleep(0)
        assert expected_wait_s(router, route, NEEDS, "interactive") == 4.0  # batch is behind
        assert expected_wait_s(router, route, NEEDS, "batch") == 8.0  # one batch ahead
        router.backends["m"][0].waiting = 2  # the engine's own queue counts too
        assert expected_wait_s(router, route, NEEDS, "interactive") == 12.0
        router.backends["m"][0].state = BackendState.DOWN
        assert expected_wait_s(router, route, NEEDS, "interactive") == math.inf
        batch.cancel()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("kind", "send", "endpoint", "sent"),
    [
        ("inhouse", True, "chat/completions", 1),
        ("vllm", True, "completions", 1),
        ("vllm", False, "chat/completions", None),  # vLLM without --scheduling-policy priority
        ("sglang", True, "chat/completions", None),
        ("llama.cpp", True, "chat/completions", None),
        ("openai", True, "chat/completions", None),
        ("inhouse", True, "embeddings", None),
    ],
)
def test_the_class_goes_upstream_only_to_backends_that_take_vllm_priority(
    kind: str, send: bool, endpoint: str, sent: int | None
) -> None:
    upstream = Upstream("u", "http://127.0.0.1:1", None, "up", kind=kind, send_priority=send)
    body = prepare(upstream, endpoint, CHAT, "salt", 16, "batch").body
    assert body.get("priority") == sent  # the client's own -1 never passes as it is


FULL_MODELS = """
[[models]]
name = "big"
policy = "degrade"
degrade_to = "small"
degrade_after_s = 2.5
queue_max_wait_s = {interactive = 5, batch = 120}
[[models.backends]]
url = "http://127.0.0.1:8001"
kind = "vllm"
send_priority = false
[[models]]
name = "small"
queue_max_wait_s = 10
[[models.backends]]
url = "http://127.0.0.1:8002"
"""


def test_the_degrade_and_class_wait_keys_parse() -> None:
    import tomllib

    big, small = parse_config(tomllib.loads(FULL_MODELS)).models
    assert (big.policy, big.degrade_to, big.degrade_after_s) == ("degrade", "small", 2.5)
    assert [big.max_wait(c) for c in ("interactive", "default", "batch")] == [5.0, 30.0, 120.0]
    assert not big.backends[0].prioritized and small.backends[0].prioritized
    assert small.max_wait("batch") == 10.0 and small.degrade_to is None


def _models(big: dict[str, Any]) -> dict[str, Any]:
    backend = {"url": "http://127.0.0.1:8001"}
    return {"models": [{"name": "big", "backends": [backend], **big},
                       {"name": "small", "backends": [backend]}]}  # fmt: skip


@pytest.mark.parametrize(
    ("big", "says"),
    [
        ({"policy": "degrade"}, "go together"),
        ({"degrade_to": "small"}, "go together"),
        ({"policy": "degrade", "degrade_to": "nope"}, "another [[models]]"),
        ({"policy": "degrade", "degrade_to": "big"}, "another [[models]]"),
        ({"queue_max_wait_s": {"urgent": 1}}, "unknown class"),
        ({"queue_max_wait_s": {"batch": -1}}, "from 0 to"),
        ({"queue_max_wait_s": float("nan")}, "from 0 to"),
        ({"queue_max_wait_s": "5"}, "number of seconds"),
        ({"policy": "degrade", "degrade_to": "small", "degrade_after_s": True}, "seconds"),
        ({"policy": "sometimes"}, "policy must be one of"),
    ],
)
def test_a_wrong_degrade_or_wait_key_is_one_clear_error(big: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says.replace("[", r"\[")):
        parse_config(_models(big))


VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8),
    st.sampled_from(["small", "big", "degrade", "queue", "fallback"]),
    st.dictionaries(st.sampled_from(["interactive", "default", "batch", "x"]),
                    st.one_of(st.floats(), st.integers(), st.text(max_size=3)), max_size=4),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    fields=st.dictionaries(
        st.sampled_from(["policy", "degrade_to", "degrade_after_s", "queue_max_wait_s"]),
        VALUES,
        max_size=4,
    ),
    send_priority=VALUES,
)
def test_any_value_of_the_new_keys_parses_or_is_a_config_error(
    fields: dict[str, Any], send_priority: Any
) -> None:
    data = _models({k: v for k, v in fields.items() if v is not None})
    if send_priority is not None:
        data["models"][0]["backends"][0]["send_priority"] = send_priority
    with contextlib.suppress(ConfigError):
        parse_config(data)


def test_a_keys_class_and_degrade_consent_are_stored_and_editable(store: KeyStore) -> None:
    key, secret = store.create("etl", priority="batch", allow_degrade=False)
    assert (key.priority, key.allow_degrade) == ("batch", False)
    assert store.authenticate(secret).priority == "batch"  # the raw SQLite lookup too
    plain = store.create("plain")[0]
    assert (plain.priority, plain.allow_degrade) == ("default", True)
    assert store.update("etl", priority="interactive", allow_degrade=True).priority == "interactive"
    with pytest.raises(ValueError, match="priority must be one of"):
        store.create("bad", priority="urgent")
    with pytest.raises(ValueError, match="priority must be one of"):
        store.update("plain", priority="soonest")


def test_the_cli_creates_lists_and_updates_a_keys_class(db_url: str) -> None:
    runner = CliRunner(env={"COLUMNS": "200"})  # the table's cells on one line each
    db = ["--database", db_url]
    made = runner.invoke(app, ["keys", "create", "etl", "--priority", "batch", "--no-degrade", *db])
    assert made.exit_code == 0, made.output
    assert "etl (batch, no degrade)" in runner.invoke(app, ["keys", "list", *db]).stdout
    changed = runner.invoke(app, ["keys", "update", "etl", "--priority", "interactive",
                                  "--degrade", *db])  # fmt: skip
    assert changed.exit_code == 0 and "allow_degrade, priority" in changed.stdout
    assert "etl (interactive)" in runner.invoke(app, ["keys", "list", *db]).stdout
    wrong = runner.invoke(app, ["keys", "create", "x", "--priority", "urgent", *db])
    assert wrong.exit_code == 2 and "priority must be one of" in wrong.output
    wrong = runner.invoke(app, ["keys", "update", "etl", "--priority", "urgent", *db])
    assert wrong.exit_code == 2


def test_a_database_from_before_classes_gains_their_columns(tmp_path: Path) -> None:
    db_file = tmp_path / "old.db"
    old = sqlite3.connect(db_file)
    old.executescript(OLD_SCHEMA)
    old.execute(
        "INSERT INTO api_keys (name, key_hash, created_at, quota_window, quota_used,"
        " allow_fallback, log_content) VALUES ('old', 'h', 1.0, 0, 0, 1, 0)"
    )
    old.commit()
    old.close()
    key = KeyStore(open_database(f"sqlite:///{db_file}"), b"pepper").get("old")
    assert (key.priority, key.allow_degrade) == ("default", True)
    audit = {row[1] for row in sqlite3.connect(db_file).execute("PRAGMA table_info(audit_log)")}
    assert {"priority", "degraded_from"} <= audit


def test_a_postgresql_database_from_before_classes_gains_their_columns(
    tmp_path: Path,
) -> None:
    pgserver = pytest.importorskip("pgserver", reason="pip install -e '.[dev]' (pgserver)")
    server = pgserver.get_server(tmp_path / "pgdata", cleanup_mode="stop")
    try:
        url = server.get_uri().replace("postgresql://", "postgresql+psycopg://", 1)
        db = create_engine(url)
        metadata.create_all(db)
        with db.begin() as conn:
            added = [("api_keys", "priority"), ("api_keys", "allow_degrade"),
                     ("audit_log", "priority"), ("audit_log", "degraded_from")]  # fmt: skip
            for table, column in added:
                conn.execute(text(f"ALTER TABLE {table} DROP COLUMN {column}"))
            conn.execute(
                text(
                    "INSERT INTO api_keys (name, key_hash, created_at, quota_window, quota_used,"
                    " allow_fallback, log_content) VALUES ('old', 'h', 1.0, 0, 0, true, false)"
                )
            )
        db.dispose()
        key = KeyStore(open_database(url), b"pepper").get("old")
        assert (key.priority, key.allow_degrade) == ("default", True)
    finally:
        server.cleanup()


def test_the_console_sets_and_changes_a_keys_class(tmp_path: Path) -> None:
    async def test(gateway: Gateway, client: httpx.AsyncClient) -> None:
        await sign_in(client, gateway.keys.create("ops", admin=True)[1])
        token = await csrf_of(client)
        form = {"name": "etl", "priority": "batch", "no_degrade": "on", "csrf": token}
        made = await client.post("/admin/keys", data=form)
        assert made.status_code == 201
        key = gateway.keys.get("etl")
        assert (key.priority, key.allow_degrade) == ("batch", False)
        page = (await client.get("/admin/keys")).text
        assert '<option value="batch" selected>' in page and "no degrade" in page
        form = {"name": "etl", "csrf": token, "priority": "interactive"}
        saved = await client.post("/admin/keys/limits", data=form)
        assert saved.status_code == 303 and gateway.keys.get("etl").priority == "interactive"
        wrong = await client.post("/admin/keys", data={"name": "x", "priority": "urgent",
                                                       "csrf": token})  # fmt: skip
        assert wrong.status_code == 400 and "priority" in wrong.text

    _run(tmp_path, test)


def test_in_a_full_queue_a_sooner_class_takes_the_place_of_the_last_later_one() -> None:
    async def scenario() -> None:
        route = dataclasses.replace(_route(), queue_max_depth=2)
        router = _router(route)
        held = await router.acquire(route, NEEDS, True)
        first, last = (
            asyncio.create_task(router.acquire(route, NEEDS, True, priority="batch"))
            for _ in range(2)
        )
        await asyncio.sleep(0)
        with pytest.raises(Overloaded):  # a batch request finds the queue full
            await router.acquire(route, NEEDS, True, priority="batch")
        chat = asyncio.create_task(router.acquire(route, NEEDS, True, priority="interactive"))
        await asyncio.sleep(0)
        with pytest.raises(Overloaded) as refused:
            await last
        assert refused.value.status_code == 429 and "sooner class" in refused.value.message
        assert router.queue_depth("m") == 2 and not first.done()
        router.release(held)
        router.release(await chat)
        await first

    asyncio.run(scenario())
