"""`inhouse keys` and `inhouse audit` against a real SQLite file."""

from __future__ import annotations

from typer.testing import CliRunner

from inhouse.cli import app


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
