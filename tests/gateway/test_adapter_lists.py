"""Where the gateway's adapters are declared and limited: a backend's `adapters` in the TOML,
a key's and a team's adapter lists in a real SQLite file and a real PostgreSQL (and in a
database from before the lists, whose rows keep every adapter), and the CLI that sets them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, make_url, text
from typer.testing import CliRunner

from inhouse.cli import app
from inhouse.gateway.config import ConfigError
from inhouse.gateway.config_file import parse_config
from inhouse.gateway.db import metadata
from inhouse.gateway.db_open import open_database
from inhouse.gateway.keys import KeyStore
from inhouse.gateway.usage.teams import TeamStore


def config(*models: dict[str, Any]) -> dict[str, Any]:
    return {"models": list(models)}


def model(name: str, *adapters: list[str], fallback: list[str] | None = None) -> dict[str, Any]:
    """A model whose backends serve `adapters` (one backend each; none given: one serving
    none)."""
    backends = [{"url": f"http://{name}-{i}:8000", "adapters": a}
                for i, a in enumerate(adapters or ([],))]  # fmt: skip
    route: dict[str, Any] = {"name": name, "backends": backends}
    if fallback is not None:
        route["fallback"] = {"url": f"http://{name}-fallback:8000", "adapters": fallback}
    return route


def test_a_backend_declares_its_adapters_and_its_model_serves_their_union() -> None:
    parsed = parse_config(
        config(model("base", ["support"], ["support", "code"], fallback=["faq"]), model("other"))
    )
    base, other = parsed.models
    assert [b.adapters for b in base.backends] == [{"support"}, {"support", "code"}]
    assert base.adapters == {"support", "code", "faq"} and other.adapters == frozenset()


@pytest.mark.parametrize(
    ("models", "complaint"),
    [
        ((model("base", ["support", "support"]),), "names one twice"),
        ((model("base", ["support", ""]),), "list of names"),
        ((model("base", "support"),), "list of names"),  # type: ignore[arg-type]
        ((model("base", ["other"]), model("other")), "also a model's name"),
        ((model("a", ["support"]), model("b", ["support"])), "declared for 'a' and 'b'"),
    ],
)
def test_an_adapter_must_have_one_place_to_go(
    models: tuple[dict[str, Any], ...], complaint: str
) -> None:
    with pytest.raises(ConfigError, match=complaint):
        parse_config(config(*models))


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    """A fresh, empty database of each kind: its SQLAlchemy URL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'gateway.db'}"
        return
    server_url: str = request.getfixturevalue("postgres")
    name = f"adapters_{tmp_path.name.lower().replace('-', '_')}"[:60]
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    yield make_url(server_url).set(database=name).render_as_string(hide_password=False)


def test_key_and_team_adapter_lists_are_stored_and_changed(database: str) -> None:
    db = open_database(database)
    keys, teams = KeyStore(db, b"pepper"), TeamStore(db)
    key, _ = keys.create("alice", adapters=frozenset({"support", "code"}))
    assert key.adapters == {"support", "code"} and key.may_use_adapter("code")
    assert not key.may_use_adapter("billing") and keys.create("bob")[0].adapters is None
    assert keys.update("alice", adapters=None).may_use_adapter("billing")
    team = teams.create("helpdesk", adapters=frozenset({"support"}))
    assert team.adapters == {"support"} and teams.create("ops").adapters is None
    assert teams.update("helpdesk", adapters=frozenset({"code"})).adapters == {"code"}
    assert teams.update("helpdesk", quota_tokens=5).adapters == {"code"}  # left as it was
    db.dispose()


def test_a_database_from_before_adapter_lists_gains_them_and_its_rows_allow_all(
    database: str,
) -> None:
    old = create_engine(database)
    metadata.create_all(old)
    with old.begin() as conn:
        for table, column in (("api_keys", "adapters"), ("teams", "adapters"),
                              ("audit_log", "adapter")):  # fmt: skip
            conn.execute(text(f"ALTER TABLE {table} DROP COLUMN {column}"))
        conn.execute(text(
            "INSERT INTO api_keys (name, key_hash, created_at, quota_window, quota_used,"
            " allow_fallback, log_content) VALUES ('old', 'h', 1.0, 0, 0, true, false)"
        ))  # fmt: skip
        conn.execute(text(
            "INSERT INTO teams (name, created_at, period_s, hard_stop, \"window\", tokens_used,"
            " money_used) VALUES ('old-team', 1.0, 86400, true, 0, 0, 0)"
        ))  # fmt: skip
    old.dispose()
    db = open_database(database)
    assert KeyStore(db, b"pepper").get("old").may_use_adapter("anything")
    assert TeamStore(db).get("old-team").adapters is None
    db.dispose()


def test_the_cli_limits_keys_and_teams_to_adapters(db_url: str) -> None:
    runner, db = CliRunner(), ["--database", db_url]

    def run(*args: str) -> str:
        result = runner.invoke(app, [*args, *db], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        return result.stdout

    run("keys", "create", "alice", "--adapters", "support, code")
    run("teams", "create", "helpdesk", "--adapters", "support")
    store, teams = KeyStore(open_database(db_url), b"unused"), TeamStore(open_database(db_url))
    assert store.get("alice").adapters == {"support", "code"}
    assert "adapters code,support" in run("keys", "list")
    assert "updated key 'alice': adapters" in run("keys", "update", "alice", "--adapters", "all")
    assert store.get("alice").adapters is None
    assert teams.get("helpdesk").adapters == {"support"}
    assert "support" in run("teams", "list")
    run("teams", "update", "helpdesk", "--adapters", "code,billing")
    assert teams.get("helpdesk").adapters == {"code", "billing"}
