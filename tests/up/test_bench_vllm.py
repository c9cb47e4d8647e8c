"""`inhouse bench calibrate`, `inhouse plan --profile` and `inhouse bench sweep --profile`
against one vLLM replica of the session's stack (`tests/vllm_stack.py`), direct: the stack
starts its replicas with a key the test knows (`$INHOUSE_UP_REPLICA_KEY`), so the probes see
one engine on one core, not the gateway spreading a batch over two. Checks the machinery (a
profile fitted from vLLM's own figures, the knee named, the prediction beside it) and prints
predicted against measured; speed is measured, not asserted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from inhouse.bench.schema import RESULTS_SCHEMA
from inhouse.cli import app
from vllm_stack import MODEL, replicas

jsonschema = pytest.importorskip("jsonschema")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # with the stack's start

MAX_NUM_SEQS = "8"  # the stack's --max-num-seqs
MAX_NUM_BATCHED_TOKENS = "2048"  # vLLM's default on a CPU (`vllm serve`, chunked prefill on)
SWEEP = {"--input-len": "96", "--output-len": "24", "--steps": "1,4,16"}
SLO_TTFT = "0.3"  # at 16 with 8 sequences a step, 8 wait a whole answer: the knee is within


def inhouse(*args: str) -> Any:
    """`inhouse …` in process; click's result (stdout, stderr, exit code)."""
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def replica(up_vllm: dict) -> list[str]:
    """The endpoint options of the stack's first replica, with its key."""
    _, url = replicas(up_vllm["log"])["vllm:1"]
    return ["--base-url", url, "--model", MODEL, "--api-key", up_vllm["replica_key"]]


@pytest.fixture(scope="module")
def profile(replica: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`inhouse bench calibrate` of that replica, told the stack's scheduler settings."""
    out = tmp_path_factory.mktemp("calibrate") / "profile.json"
    result = inhouse(
        "bench", "calibrate", *replica, "--max-num-seqs", MAX_NUM_SEQS,
        "--max-num-batched-tokens", MAX_NUM_BATCHED_TOKENS, "--out", str(out),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    print(result.stdout)
    return out


def test_calibration_fits_the_replicas_own_figures(profile: Path, replica: list[str]) -> None:
    document = json.loads(profile.read_text())
    assert document["model"] == MODEL and document["speculation"] is None  # no drafts
    assert document["scheduler"] == {"max_num_seqs": 8, "max_num_batched_tokens": 2048}
    assert document["step_cost"]["source"] == f"calibrated: {replica[1]}"
    measured = document["measured"]
    # batches past the stack's 8 sequences are not probed; the long ones ran 4 at 1,024
    assert [d["batch"] for d in measured["decode"]] == [1, 2, 4, 8, 1, 4]
    prompts = [p["prompt_tokens"] for p in measured["prefill"]]
    # vLLM's /tokenize sized the prompts (its usage counts them); the longest fits 2,048
    assert abs(prompts[0] - 64) <= 4 and prompts == sorted(prompts)
    assert 1024 < prompts[-1] <= 2048 - 24
    assert all(p["ttft_s"] > 0 for p in measured["prefill"])
    assert all(d["step_s"] > 0 for d in measured["decode"])


def test_plan_and_sweep_name_both_knees(profile: Path, replica: list[str], tmp_path: Path) -> None:
    planned = inhouse(
        "plan", "--cpu", "--profile", str(profile), "--prompt-tokens", SWEEP["--input-len"],
        "--output-tokens", SWEEP["--output-len"], "--slo-ttft", SLO_TTFT, "--json",
    )  # fmt: skip
    assert planned.exit_code == 0, planned.output
    plan = json.loads(planned.stdout)["latency"]
    swept = inhouse(
        "bench", "sweep", *replica, *(x for pair in SWEEP.items() for x in pair),
        "--ignore-eos", "--slo", f"ttft={SLO_TTFT}s", "--prompts-per-slot", "1",
        "--min-prompts", "2", "--profile", str(profile), "--out", str(tmp_path),
    )  # fmt: skip
    assert swept.exit_code == 0, swept.output
    document = json.loads((tmp_path / "results.json").read_text())
    jsonschema.validate(document, RESULTS_SCHEMA)
    assert all(run["summary"]["failed"] == 0 for run in document["runs"])
    knee = document["sweep"]["knee"]
    comparison = document["prediction"]["comparison"]
    assert knee in (1, 4, 16) and comparison["measured_knee"] == knee
    assert comparison["predicted_knee"] in (1, 4, 16)  # the simulated queue passes 0.3 s too
    assert "knee: predicted" in swept.stdout
    print(
        f"vLLM replica, {SWEEP['--input-len']} → {SWEEP['--output-len']} tokens, "
        f"p99 TTFT ≤ {SLO_TTFT} s: plan's largest concurrency within "
        f"{plan['max_concurrency_within_slo']}; knee predicted {comparison['predicted_knee']}, "
        f"measured {knee}; TPOT p50 at {comparison['at']}: predicted "
        f"{comparison['tpot_predicted'] * 1000:.1f} ms, measured "
        f"{(comparison['tpot_measured'] or 0) * 1000:.1f} ms"
    )
