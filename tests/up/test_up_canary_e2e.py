"""`inhouse up --canary MANIFEST --percent P`: a real stable replica, a candidate replica of
what a manifest pins (the bundled model at q8), the gateway in front; the candidate answers
as release 2 once ready and its replica is stopped when the release is rolled back."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import openai
import pytest

from inhouse.manifests.bundled import DEFAULT_CHAT_MODEL_NAME, default_chat_model
from serving import audit_rows, free_port, inhouse_command, pid_alive, wait_healthy

pytest.importorskip("inhouse.server.app", reason="inhouse serve is not importable")

pytestmark = pytest.mark.slow


def _wait_for(log: Path, pattern: str, timeout: float) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text(), flags=re.MULTILINE)
        if found:
            return found
        time.sleep(0.5)
    pytest.fail(f"{pattern!r} not in the log after {timeout} s:\n{log.read_text()[-3000:]}")


def test_up_starts_a_canary_from_a_manifest_and_stops_it_on_rollback(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "INHOUSE_HOME": str(home)}
    manifest = tmp_path / "q8.model.toml"
    lock = [*inhouse_command(), "models", "lock", str(default_chat_model()), "--out",
            str(manifest), "--name", DEFAULT_CHAT_MODEL_NAME, "--quantization", "q8"]  # fmt: skip
    subprocess.run(lock, check=True, capture_output=True, env=env, timeout=300)
    port, log = free_port(), tmp_path / "up.log"
    args = [*inhouse_command(), "up", "--port", str(port), "--no-embeddings", "--canary",
            str(manifest), "--percent", "100"]  # fmt: skip
    with open(log, "wb") as out:
        up = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", up, log, 300)
        secret = _wait_for(log, r"^ih-\S+$", 10).group(0)
        pid = int(_wait_for(log, r"^candidate inhouse:2: pid (\d+) ", 10).group(1))
        _wait_for(log, r"candidate release 2 of .* takes 100% of keys", 300)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=secret)
        reply = client.chat.completions.create(
            model=DEFAULT_CHAT_MODEL_NAME, messages=[{"role": "user", "content": "Hi"}],
            max_tokens=2,
        )  # fmt: skip
        assert reply.usage is not None and reply.usage.completion_tokens >= 1
        db_url = f"sqlite:///{home / 'gateway.db'}"
        (row,) = audit_rows(db_url, "admin", 1)
        assert row["release"] == 2 and row["backend"] == "inhouse:2"
        rollback = [*inhouse_command(), "release", "rollback", DEFAULT_CHAT_MODEL_NAME,
                    "--reason", "test"]  # fmt: skip
        subprocess.run(rollback, check=True, capture_output=True, env=env, timeout=60)
        _wait_for(log, r"candidate release 2 was rolled back; stopping inhouse:2", 30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.5)
        assert not pid_alive(pid)
        client.chat.completions.create(
            model=DEFAULT_CHAT_MODEL_NAME, messages=[{"role": "user", "content": "Hi"}],
            max_tokens=2,
        )  # fmt: skip
        rows = audit_rows(db_url, "admin", 2)
        assert rows[-1]["release"] == 1 and rows[-1]["backend"] == "inhouse:1"
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
    assert up.returncode == 0, log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()
