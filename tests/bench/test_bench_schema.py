import json
from pathlib import Path

import jsonschema
import pytest

from inhouse.bench.loadgen import LoadShape
from inhouse.bench.metrics import Slo, summarize
from inhouse.bench.requests import RequestRecord
from inhouse.bench.results import results_document, write_results
from inhouse.bench.run import RunResult
from inhouse.bench.schema import RESULTS_SCHEMA, SCHEMA_VERSION
from inhouse.bench.scrape import ServerReadings
from inhouse.bench.sweep import judge


def _run(concurrency: int) -> RunResult:
    records = [
        RequestRecord(
            index=0,
            start=0.0,
            status=200,
            ttft=0.2,
            e2e=0.5,
            chunk_times=[0.2, 0.35, 0.5],
            prompt_tokens=12,
            output_tokens=3,
            token_source="usage",
            finish_reason="length",
            output_text="a b c",
        ),
        RequestRecord(index=1, start=0.1, status=429, error="http: slow down", e2e=0.01),
    ]
    shape = LoadShape(max_concurrency=concurrency, num_prompts=2)
    return RunResult(shape, summarize(records, 1.0, Slo(ttft=1.0)), records, ServerReadings())


def test_sweep_document_validates_and_round_trips(tmp_path: Path) -> None:
    runs = [_run(1), _run(2)]
    config = {"base_url": "http://x", "model": "m", "dataset": {}, "slo": {"ttft": 1.0}}
    document = results_document("sweep", config, runs, judge([1, 2], None, 1.5), ["a note"])
    jsonschema.validate(document, RESULTS_SCHEMA)
    loaded = json.loads(write_results(document, tmp_path / "out").read_text())
    jsonschema.validate(loaded, RESULTS_SCHEMA)
    assert loaded["schema_version"] == SCHEMA_VERSION == 1
    assert loaded["runs"][1]["max_concurrency"] == 2
    assert loaded["runs"][0]["requests"][0]["tpot"] == pytest.approx(0.15)
    assert loaded["runs"][0]["summary"]["failures"] == {"http_429": 1}
    assert loaded["sweep"]["predicted_max_concurrency"] == 1.5


def test_schema_rejects_a_document_missing_a_metric() -> None:
    config = {"base_url": "http://x", "model": "m", "dataset": {}, "slo": {}}
    document = results_document("run", config, [_run(1)])
    del document["runs"][0]["summary"]["ttft"]["p99"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, RESULTS_SCHEMA)


def test_version_1_fields_stay_required() -> None:
    """Within schema_version 1 fields may be added, never removed or renamed."""
    run = RESULTS_SCHEMA["properties"]["runs"]["items"]
    summary = run["properties"]["summary"]
    request = run["properties"]["requests"]["items"]
    assert set(RESULTS_SCHEMA["required"]) >= {
        "schema_version",
        "kind",
        "created",
        "config",
        "notes",
        "runs",
        "sweep",
    }
    assert set(summary["required"]) >= {
        "completed",
        "failed",
        "failures",
        "duration",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "goodput",
        "slo_met",
        "token_sources",
        "ttft",
        "tpot",
        "itl",
        "e2e",
    }
    assert set(request["required"]) >= {
        "index",
        "start",
        "status",
        "error",
        "ok",
        "outcome",
        "ttft",
        "tpot",
        "e2e",
        "chunk_times",
        "prompt_tokens",
        "output_tokens",
        "token_source",
        "finish_reason",
    }
    distribution = summary["properties"]["ttft"]["required"]
    assert set(distribution) >= {"count", "mean", "p50", "p90", "p95", "p99", "max"}
