"""`inhouse eval` end to end: one real `inhouse serve` of the bundled model started from a
verified manifest, one real `inhouse gateway` in front of it with a key, the real CLI.

The same items run straight at the server (A) and through the gateway under a key (B): the
report carries both accuracies and the paired difference, and the gateway's audit holds one
row per item under that key with the token counts the report read from each answer.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from inhouse.eval.graders import GRADERS
from inhouse.eval.items import load_eval_set, starter_set
from inhouse.launch.inhouse import inhouse_command
from inhouse.launch.ports import free_port
from inhouse.manifests.bundled import default_chat_model
from inhouse.manifests.verify import lock
from serving import Process, audit_rows, gateway_key, gateway_process

pytestmark = pytest.mark.slow

CHAT_MODEL = "SmolLM2-135M-Instruct"
KEY_NAME = "eval-team"
PER_GRADER = 2  # items of each grader taken from the starter set


@dataclass(frozen=True)
class Stack:
    serve_url: str
    serve_key: str
    gateway_url: str
    secret: str
    db_url: str
    revision: str
    manifest: Path
    base: Path


def _gateway_config(port: int, db_url: str, serve_url: str, serve_key: str) -> str:
    return f"""
[gateway]
port = {port}
database = "{db_url}"

[audit]
flush_interval_s = 0.2

[[models]]
name = "smol"
[[models.backends]]
name = "smol-1"
url = "{serve_url}"
api_key = "{serve_key}"
model = "{CHAT_MODEL}"
capabilities = ["chat", "completions", "tools", "json_schema"]
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("eval-e2e")
    pinned = lock(default_chat_model(), name=CHAT_MODEL, revision="bundled-q4_1")
    manifest = base / "inhouse.model.toml"
    manifest.write_text(pinned.to_toml())
    serve_key = secrets.token_urlsafe(24)
    serve_port, gateway_port = free_port(), free_port()
    serve_url = f"http://127.0.0.1:{serve_port}"
    serve = Process(
        [*inhouse_command(), "serve", "--manifest", str(manifest), "--port", str(serve_port),
         "--embedding-model", "none", "--max-model-len", "1024", "--kv-cache-memory", "64MiB"],
        base / "serve.log",
        {"INHOUSE_API_KEY": serve_key},
    )  # fmt: skip
    db_url = f"sqlite:///{base / 'gateway.db'}"
    config_path = base / "inhouse.toml"
    gateway = gateway_process(
        config_path, _gateway_config(gateway_port, db_url, serve_url, serve_key)
    )
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    try:
        for process in (serve, gateway):
            process.start()
        serve.wait_healthy(f"{serve_url}/health", 300)
        gateway.wait_healthy(f"{gateway_url}/health", 60)
        secret = gateway_key(config_path, KEY_NAME)
        yield Stack(
            serve_url, serve_key, gateway_url, secret, db_url, pinned.revision, manifest, base
        )
    finally:
        gateway.stop()
        serve.stop()


def test_version_shows_the_verified_manifest_revision(stack: Stack) -> None:
    info = httpx.get(f"{stack.serve_url}/version", timeout=10).json()
    assert info["model_revision"] == "bundled-q4_1"
    assert info["manifest_verified"] is True
    assert info["manifest"] == str(stack.manifest.resolve())
    assert info["served_model_name"] == CHAT_MODEL
    assert "revision bundled-q4_1, verified" in (stack.base / "serve.log").read_text()


def _subset(path: Path) -> Path:
    """A few starter items of every grader, chat and completions, as the user would write."""
    taken: dict[str, int] = {}
    lines = []
    for item in load_eval_set(starter_set()):
        if taken.get(item.grader, 0) < PER_GRADER:
            taken[item.grader] = taken.get(item.grader, 0) + 1
            lines.append(json.dumps(item.raw))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_eval_compares_the_server_with_the_gateway_and_the_audit_counts_it(
    stack: Stack, tmp_path: Path
) -> None:
    eval_set, out = _subset(tmp_path / "subset.jsonl"), tmp_path / "out"
    n = len(load_eval_set(eval_set))
    command = [*inhouse_command(), "eval", str(eval_set), "--out", str(out)]
    command += ["--base-url", f"{stack.serve_url}/v1", "--name", "direct"]
    command += ["--vs-base-url", stack.gateway_url, "--vs-model", "smol", "--vs-name", "gateway"]
    command += ["--vs-api-key", stack.secret, "--concurrency", "4"]
    env = {**os.environ, "OPENAI_API_KEY": stack.serve_key}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "paired difference gateway − direct" in done.stdout
    report = json.loads((out / "report.json").read_text())
    direct, gateway = report["endpoints"]
    assert direct["model"] == CHAT_MODEL and gateway["model"] == "smol"
    for side in (direct, gateway):
        assert side["errors"] == 0 and side["accuracy"]["n"] == n
        assert 0 < side["accuracy"]["correct"] < n  # the small model passes some, not all
        assert set(side["by_grader"]) == set(GRADERS)
    paired = report["comparison"]["paired_difference"]
    assert paired["n"] == n and paired["low"] <= paired["diff"] <= paired["high"]
    assert 0.0 <= report["comparison"]["mcnemar_exact_p"] <= 1.0
    rows = audit_rows(stack.db_url, KEY_NAME, expect=n)
    assert len(rows) == n and all(r["status"] == 200 for r in rows)
    answers = [row["gateway"] for row in report["per_item"]]
    assert sum(r["completion_tokens"] for r in rows) == sum(a["completion_tokens"] for a in answers)
    assert sum(r["prompt_tokens"] for r in rows) == sum(a["prompt_tokens"] for a in answers)
    assert (out / "accuracy_by_tag.png").stat().st_size > 10_000
