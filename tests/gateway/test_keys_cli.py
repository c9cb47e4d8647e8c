"""`inhouse keys` and `inhouse audit` against a real SQLite file."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inhouse.cli import app
from inhouse.gateway.config import GatewayConfig
from inhouse.gateway.db_open import open_database
from inhouse.gateway.keys import AuthError, KeyStore, load_pepper
from inhouse.launch.inhouse import inhouse_command
from serving import gateway_toml


def test_create_list_update_revoke(db_url: str) -> None:
    runner = CliRunner()
    db = ["--database", db_url]
    created = runner.invoke(
        app, ["keys", "create", "alice", "--rpm", "30", "--quota-tokens", "1000", "--period", "1d",
              "--expires", "90d", "--models", "a,b", *db],
    )  # fmt: skip
    assert created.exit_code == 0, created.output
    secret = created.stdout.strip().splitlines()[-1]
    assert secret.startswith("ih-")
    listed = runner.invoke(app, ["keys", "list", *db])
    assert listed.exit_code == 0 and "alice" in listed.stdout and secret not in listed.stdout
    assert "0/1000" in listed.stdout and "active" in listed.stdout
    updated = runner.invoke(app, ["keys", "update", "alice", "--rpm", "0", "--tpm", "500", *db])
    assert updated.exit_code == 0 and "rpm, tpm" in updated.stdout
    assert runner.invoke(app, ["keys", "revoke", "alice", *db]).exit_code == 0
    assert "revoked" in runner.invoke(app, ["keys", "list", *db]).stdout
    missing = runner.invoke(app, ["keys", "revoke", "nobody", *db])
    assert missing.exit_code == 1
    duplicate = runner.invoke(app, ["keys", "create", "alice", *db])
    assert duplicate.exit_code != 0
    audit = runner.invoke(app, ["audit", *db])
    assert audit.exit_code == 0 and "Totals per key" in audit.stdout


def test_rotate_gives_a_new_secret_and_refuses_the_old_one(db_url: str) -> None:
    runner, db = CliRunner(), ["--database", db_url]
    old = runner.invoke(app, ["keys", "create", "bob", "--rpm", "7", *db]).stdout.split()[-1]
    rotated = runner.invoke(app, ["keys", "rotate", "bob", *db])
    assert rotated.exit_code == 0, rotated.output
    new = rotated.stdout.split()[-1]
    store = KeyStore(open_database(db_url), load_pepper(GatewayConfig(models=(), database=db_url)))
    assert new.startswith("ih-") and new != old and store.authenticate(new).rpm == 7
    with pytest.raises(AuthError):
        store.authenticate(old)
    assert runner.invoke(app, ["keys", "rotate", "nobody", *db]).exit_code == 1


def test_a_config_the_command_cannot_use_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """A backend's `api_key_env` unset: `inhouse keys create` says so in one line, exit 2."""
    config = tmp_path / "inhouse.toml"
    backend = {"url": "http://127.0.0.1:9", "api_key_env": "INHOUSE_TEST_UNSET"}
    config.write_text(
        gateway_toml(
            {"database": f"sqlite:///{tmp_path / 'gw.db'}"}, [{"name": "m", "backends": [backend]}]
        )
    )
    env = {k: v for k, v in os.environ.items() if k != "INHOUSE_TEST_UNSET"}
    done = subprocess.run(
        [*inhouse_command(), "keys", "create", "x", "-c", str(config)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert "$INHOUSE_TEST_UNSET is not set (or is empty)" in line
