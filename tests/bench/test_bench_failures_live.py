"""Failures from live processes: a gateway's 429 and 503 in front of a real `inhouse serve`, and
the server killed mid-run. Each is counted by outcome and every run still ends with a report.

Tests run in file order on one stack; the one that kills the server comes last.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from typer.testing import CliRunner

from inhouse.bench.schema import RESULTS_SCHEMA
from inhouse.cli import app
from serving import SERVE_KEY as API_KEY
from serving import (
    Served,
    free_port,
    gateway_toml,
    inhouse_command,
    start_serve,
    stop,
    wait_healthy,
)

pytest.importorskip("inhouse.server")
pytestmark = pytest.mark.slow


@dataclass
class Stack:
    served: Served
    gateway_url: str
    gateway: subprocess.Popen
    store: Any

    def key(self, name: str, **limits: Any) -> str:
        return self.store.create(name, **limits)[1]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from inhouse.gateway.config_file import load_config
    from inhouse.gateway.db_open import open_database
    from inhouse.gateway.keys import KeyStore, load_pepper

    base = tmp_path_factory.mktemp("bench-live")
    served = start_serve(base / "serve.log", max_model_len="512", max_num_seqs="4")
    port, database = free_port(), f"sqlite:///{base / 'gateway.db'}"
    config_path = base / "gateway.toml"
    backend = {
        "name": "serve", "url": served.url, "api_key": API_KEY, "model": served.model,
        "capabilities": ["chat", "completions"], "max_context": 512,
    }  # fmt: skip
    model = {"name": "smol", "policy": "queue", "queue_max_depth": 4, "queue_max_wait_s": 1}
    config_path.write_text(
        gateway_toml(
            {"port": port, "database": database},
            [{**model, "backends": [backend]}],
            health={"interval_s": 0.5, "timeout_s": 5},
        )
    )
    store = KeyStore(open_database(database), load_pepper(load_config(config_path)))
    with (base / "gateway.log").open("w") as log:
        gateway = subprocess.Popen(
            [*inhouse_command(), "gateway", "--config", str(config_path)], stdout=log, stderr=log
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{url}/health", gateway, base / "gateway.log", 60)
        yield Stack(served, url, gateway, store)
    finally:
        stop(gateway)
        served.stop()


@pytest.fixture(autouse=True)
def alive(stack: Stack) -> None:
    """The server up again (and routed to) if an earlier test killed it."""
    process = stack.served.process
    if process.popen is not None and process.popen.poll() is None:
        return
    process.start()
    assert process.popen is not None
    wait_healthy(f"{stack.served.url}/health", process.popen, process.log, 300)
    deadline = time.monotonic() + 30
    while _status(f"{stack.gateway_url}/health") != 200:
        assert time.monotonic() < deadline, "the gateway never routed to the restarted server"
        time.sleep(0.2)


def _status(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.TransportError:
        return None


def _results(out: Path) -> dict[str, Any]:
    document = json.loads((out / "results.json").read_text())
    jsonschema.validate(document, RESULTS_SCHEMA)
    return document["runs"][0]


def _bench_via_gateway(stack: Stack, key: str, prompts: int, out: Path) -> Any:
    return CliRunner().invoke(
        app,
        [
            "bench",
            "run",
            "--base-url",
            f"{stack.gateway_url}/v1",
            "--model",
            "smol",
            "--api-key",
            key,
            "--max-concurrency",
            "1",
            "--num-prompts",
            str(prompts),
            "--warmup",
            "0",
            "--input-len",
            "16",
            "--output-len",
            "4",
            "--out",
            str(out),
        ],
    )


def test_gateway_429s_are_counted_and_reported(stack: Stack, tmp_path: Path) -> None:
    result = _bench_via_gateway(stack, stack.key("two-a-minute", rpm=2), 6, tmp_path)
    assert result.exit_code == 0, result.output
    summary = _results(tmp_path)["summary"]
    assert 1 <= summary["completed"] <= 2
    assert summary["failures"] == {"http_429": 6 - summary["completed"]}
    assert f"http_429: {6 - summary['completed']}" in result.stdout


def _long_answers(url: str) -> float:
    """Finished requests that generated more than 20 tokens (the gateway's health probes are
    tiny, so they are not among them)."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    total = short = 0.0
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("inhouse:request_generation_tokens_count"):
            total += float(value)
        elif name.startswith("inhouse:request_generation_tokens_bucket") and 'le="20.0"' in name:
            short += float(value)
    return total - short


def test_server_killed_mid_run_then_gateway_503s(stack: Stack, tmp_path: Path) -> None:
    served, out = stack.served, tmp_path / "killed"
    command = [
        *inhouse_command(),
        "bench",
        "run",
        "--base-url",
        served.url,
        "--model",
        served.model,
        "--api-key",
        API_KEY,
        "--max-concurrency",
        "4",
        "--num-prompts",
        "40",
        "--warmup",
        "0",
        "--input-len",
        "32",
        "--output-len",
        "24",
        "--ignore-eos",
        "--out",
        str(out),
    ]
    before = _long_answers(served.url)
    bench = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while _long_answers(served.url) < before + 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    served.process.kill()
    output = bench.communicate(timeout=120)[0].decode()
    assert bench.returncode == 0, output
    summary = _results(out)["summary"]
    assert summary["completed"] >= 3 and summary["completed"] + summary["failed"] == 40
    assert summary["failed"] > 0 and set(summary["failures"]) <= {"connection", "stream"}
    assert "connection" in output

    deadline = time.monotonic() + 30
    while _status(f"{stack.gateway_url}/health") != 503:
        assert time.monotonic() < deadline, "the gateway never noticed its backend died"
        time.sleep(0.2)
    result = _bench_via_gateway(stack, stack.key("after-the-crash"), 3, tmp_path / "503")
    assert result.exit_code == 0, result.output
    summary = _results(tmp_path / "503")["summary"]
    assert summary["completed"] == 0 and summary["failures"] == {"http_503": 3}
    assert "http_503: 3" in result.stdout
