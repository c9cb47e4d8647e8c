"""`inhouse bench run --mix` against a real `inhouse serve`: classes driven at once, each with
its own key, shape and tags, reported apart in the table and the results file."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from inhouse.bench.schema import RESULTS_SCHEMA
from inhouse.cli import app
from serving import SERVE_KEY, Served

pytest.importorskip("inhouse.server")
pytestmark = pytest.mark.slow


def test_a_mix_reports_each_class_with_its_own_key_and_counts(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MIX_CHAT_KEY", SERVE_KEY)
    monkeypatch.setenv("MIX_WRONG_KEY", "not-the-key")
    result = CliRunner().invoke(
        app,
        [
            "bench", "run", "--base-url", served.url, "--model", served.model,
            "--api-key", SERVE_KEY, "--warmup", "0", "--ignore-eos", "--out", str(tmp_path),
            "--mix", "chat: max-concurrency=1, input-len=40, output-len=4, num-prompts=3, "
            "priority=-1, cache-salt=alice, api-key-env=MIX_CHAT_KEY",
            "--mix", "batch: max-concurrency=2, input-len=80, output-len=6, priority=1",
            "--mix", "intruder: max-concurrency=1, num-prompts=2, api-key-env=MIX_WRONG_KEY",
        ],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "inhouse bench --mix" in result.stdout and "inhouse bench · batch" in result.stdout
    assert "batch: background" in result.stdout
    document = json.loads((tmp_path / "results.json").read_text())
    jsonschema.validate(document, RESULTS_SCHEMA)
    assert document["kind"] == "mix" and SERVE_KEY not in json.dumps(document)
    runs = {run["class"]["name"]: run for run in document["runs"]}
    assert list(runs) == ["chat", "batch", "intruder"]
    assert [c["name"] for c in document["config"]["mix"]] == ["chat", "batch", "intruder"]

    chat = runs["chat"]["summary"]
    assert (chat["completed"], chat["failed"], chat["total_output_tokens"]) == (3, 0, 12)
    assert 0 < chat["ttft"]["p50"] <= chat["ttft"]["p99"]
    assert runs["chat"]["class"]["priority"] == -1 and runs["chat"]["max_concurrency"] == 1
    assert all(abs(r["prompt_tokens"] - 40) <= 2 for r in runs["chat"]["requests"])

    # The background class kept its 2 in flight while the counted ones ran, then stopped.
    batch = runs["batch"]
    assert batch["class"]["background"] and batch["summary"]["failed"] == 0
    assert batch["summary"]["completed"] >= 2
    assert batch["summary"]["total_output_tokens"] == 6 * batch["summary"]["completed"]
    first_starts = sorted(r["start"] for r in batch["requests"])[:2]
    assert first_starts[-1] < chat["duration"]

    # Its own (wrong) key: refused by the server, while the other classes were served.
    intruder = runs["intruder"]["summary"]
    assert (intruder["completed"], intruder["failures"]) == (0, {"http_401": 2})
    assert all(abs(r["prompt_tokens"] - 80) <= 2 for r in batch["requests"])
