"""A server killed mid-run: the requests it drops are counted and the run still reports."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx
import jsonschema
import pytest
from bench_serving import API_KEY, INHOUSE, start_serve

from inhouse.bench.schema import RESULTS_SCHEMA

pytest.importorskip("inhouse.server")
pytestmark = pytest.mark.slow


def _finished_requests(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("inhouse:request_success_total")
    )


def test_killed_server_failures_are_counted_and_the_run_reports(tmp_path: Path) -> None:
    served = start_serve(tmp_path / "serve.log", "--max-model-len", "512", "--max-num-seqs", "4")
    out = tmp_path / "out"
    command = [
        INHOUSE,
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
        "--output-len",
        "24",
        "--ignore-eos",
        "--timeout",
        "60",
        "--out",
        str(out),
    ]
    try:
        bench = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while _finished_requests(served.url) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        served.process.kill()
        output, _ = bench.communicate(timeout=120)
    finally:
        served.stop()
    text = output.decode()
    assert bench.returncode == 0, text
    document = json.loads((out / "results.json").read_text())
    jsonschema.validate(document, RESULTS_SCHEMA)
    summary = document["runs"][0]["summary"]
    assert summary["completed"] >= 3 and summary["failed"] > 0
    assert summary["completed"] + summary["failed"] == 40
    assert set(summary["failures"]) <= {"connection", "stream"}
    assert "failed" in text and "connection" in text
