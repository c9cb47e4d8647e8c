"""`inhouse up` makes its replicas the stable release (release 1 on the first start), so the
documented `inhouse release canary|status|rollback` commands work against the stack `make
run` starts, with no gateway config file."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from inhouse.gateway.config import GatewayConfig
from inhouse.gateway.config_file import parse_config
from inhouse.gateway.db_open import open_database
from inhouse.gateway.releases.store import ReleaseStore
from inhouse.manifests.bundled import DEFAULT_CHAT_MODEL_NAME
from inhouse.up.releases import ensure_stable_releases
from serving import free_port, inhouse_command, start_serve, up_release_cli, wait_healthy

CANDIDATE_KEY_ENV = "INHOUSE_TEST_CANDIDATE_KEY"


def _config(db_url: str, replicas: int) -> GatewayConfig:
    backends = [{"name": f"inhouse:{i}", "url": f"http://127.0.0.1:{9000 + i}"}
                for i in range(1, replicas + 1)]  # fmt: skip
    return parse_config({"gateway": {"database": db_url},
                         "models": [{"name": "chat", "backends": backends},
                                    {"name": "embed", "backends": backends}]})  # fmt: skip


def test_the_first_start_makes_release_1_and_other_replicas_a_new_stable_one(
    tmp_path: Path,
) -> None:
    db_url = f"sqlite:///{tmp_path / 'gateway.db'}"
    assert ensure_stable_releases(_config(db_url, 2), "chat", None) == {"chat": 1, "embed": 1}
    assert ensure_stable_releases(_config(db_url, 2), "chat", None) == {"chat": 1, "embed": 1}
    store = ReleaseStore(open_database(db_url))
    assert [e["action"] for e in store.events("chat")] == ["create"]  # the restart: no change
    assert ensure_stable_releases(_config(db_url, 1), "chat", None) == {"chat": 2, "embed": 2}
    state = store.state("chat")
    assert state is not None and (state.stable, state.candidate) == (2, None)
    assert [b.name for b in store.releases("chat")[2].backends] == ["inhouse:1"]


@pytest.mark.slow
def test_release_commands_work_against_up_without_a_config(tmp_path: Path) -> None:
    key = "candidate-key"
    candidate = start_serve(tmp_path / "candidate.log", key)
    env = {**os.environ, "INHOUSE_HOME": str(tmp_path / "home"), CANDIDATE_KEY_ENV: key}
    port, log = free_port(), tmp_path / "up.log"
    with open(log, "wb") as out:  # as `make run`, on its own port
        up = subprocess.Popen([*inhouse_command(), "up", "--port", str(port)], stdout=out,
                              stderr=subprocess.STDOUT, env=env)  # fmt: skip
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", up, log, 300)
        assert re.search(rf"Stable release 1 of '{DEFAULT_CHAT_MODEL_NAME}'", log.read_text())
        model = DEFAULT_CHAT_MODEL_NAME
        canary = up_release_cli(env, "canary", model, "--backend", candidate.url, "--percent", "10",
                          "--upstream-model", candidate.model,
                          "--api-key-env", CANDIDATE_KEY_ENV)  # fmt: skip
        assert "stable release 1, candidate release 2 at 10% of keys" in canary
        status = json.loads(up_release_cli(env, "status", model, "--json"))
        assert (status["state"]["stable"], status["state"]["candidate"]) == (1, 2)
        assert status["state"]["percent"] == 10
        assert [r["backends"][0]["url"] for r in status["releases"]] == [None, candidate.url]
        assert model in up_release_cli(env, "status", model)  # the tables, too
        rolled = up_release_cli(env, "rollback", model, "--reason", "test")
        assert f"{model}: stable release 1 ·" in rolled
        after = json.loads(up_release_cli(env, "status", model, "--json"))["state"]
        assert (after["stable"], after["candidate"]) == (1, None)
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
        candidate.stop()
    assert up.returncode == 0, log.read_text()[-3000:]
