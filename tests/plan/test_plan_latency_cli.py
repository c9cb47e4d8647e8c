"""`inhouse plan` with a latency prediction: from a profile, a CPU, or a GPU's roofline."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from inhouse.launch.plan_command import EXIT_BAD_INPUT, plan
from inhouse.plan.perf_model import Profile, StepCost

app = typer.Typer()
app.command()(plan)

COST = StepCost(
    base_s=0.02, weights_s=0.01, token_s=0.0004, seq_s=0.002, context_s=1e-6, pair_s=1e-9,
    request_s=0.005, source="calibrated: test",
)  # fmt: skip


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def write_profile(tmp_path: Path, max_num_seqs: int = 16) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(Profile(COST, "m", max_num_seqs, 2048, {}).to_json()))
    return path


def test_profile_predicts_the_curve_and_says_which_limit_binds(tmp_path: Path) -> None:
    result = run(
        "smollm2", "--weights", "bf16", "--vram", "8GiB", "--profile",
        str(write_profile(tmp_path)), "--steps", "1,4,16,32", "--slo-ttft", "2", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    latency = json.loads(result.stdout)["latency"]
    assert latency["step_cost"]["source"] == "calibrated: test"
    assert latency["note"] is None  # a measured profile is no guess
    assert latency["scheduler"]["max_num_seqs"] == 16  # the profile's, not the memory plan's
    curve = {p["concurrency"]: p for p in latency["curve"]}
    assert list(curve) == [1, 4, 16, 32]
    within = latency["max_concurrency_within_slo"]
    assert 1 <= within < 32
    knee = latency["predicted_knee"]
    assert knee == min(c for c, p in curve.items() if p["ttft_p99"] > 2)
    assert latency["binds"] == "latency"  # SmolLM2's KV for 384 tokens: thousands fit
    assert latency["memory_max_concurrent"] > within


def test_cpu_target_reports_both_limits_in_words() -> None:
    result = run(
        "smollm2", "--cpu", "--ram", "8GiB", "--cores", "2", "--mem-bandwidth", "27",
        "--weights", "bf16", "--request-rate", "1",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "step cost from roofline: CPU, 2 cores, 27 GB/s" in out
    assert "Latency limit:" in out and "memory limit:" in out and "binds" in out
    assert "Open loop at 1 requests/s: TTFT p50" in out
    # The guess says it is one, and how to replace it with this host's figures.
    assert "Uncalibrated: a roofline guess" in out and "pessimistic, 3-4x" in out
    assert "inhouse bench calibrate" in out and "inhouse plan --profile" in out


def test_a_gpu_roofline_prediction_on_request() -> None:
    result = run("llama-3.1-8b", "--gpu", "A100-40G", "--latency", "--json")
    assert result.exit_code == 0, result.stderr
    latency = json.loads(result.stdout)["latency"]
    assert latency["step_cost"]["source"] == "roofline: A100 40G SXM"
    assert latency["curve"][0]["concurrency"] == 1


def test_latency_without_hardware_is_one_clear_error() -> None:
    result = run("llama-3.1-8b", "--vram", "80GiB", "--latency")
    assert result.exit_code == EXIT_BAD_INPUT
    assert "needs --gpu, --cpu or --profile" in result.stderr


def test_a_broken_profile_is_one_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text("{not json")
    result = run("smollm2", "--vram", "8GiB", "--profile", str(path))
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.stderr.startswith("inhouse plan: profile") and "not JSON" in result.stderr


def test_a_prompt_longer_than_the_budget_without_chunking_is_refused(tmp_path: Path) -> None:
    result = run(
        "smollm2", "--vram", "8GiB", "--profile", str(write_profile(tmp_path)),
        "--prompt-tokens", "3000",
        "--no-chunked-prefill",
    )  # fmt: skip
    assert result.exit_code == EXIT_BAD_INPUT
    assert "never fits a step of 2048 tokens without chunked prefill" in result.stderr


def test_impossible_cpu_and_slo_values_are_one_clear_error() -> None:
    for flags, fragment in (
        (["--cpu", "--cores", "0"], "--cores ≥ 1"),
        (["--cpu", "--mem-bandwidth", "0"], "positive --mem-bandwidth"),
        (["--cpu", "--slo-ttft", "0"], "--slo-ttft must be a positive"),
    ):
        result = run("smollm2", *flags)
        assert result.exit_code == EXIT_BAD_INPUT, flags
        assert fragment in result.stderr and "Traceback" not in result.stderr


MIXED = ("--batch-load", "in-flight=8, prompt-tokens=1000, output-tokens=64")
CHATS = ("--interactive", "clients=1, requests=10, prompt-tokens=40, output-tokens=16")


def test_a_batch_load_predicts_interactive_latency_per_policy(tmp_path: Path) -> None:
    profile = str(write_profile(tmp_path))
    args = ("smollm2", "--vram", "8GiB", "--profile", profile, "--steps", "1", *MIXED, *CHATS)
    result = run(*args, "--scheduling-policy", "priority", "--json")
    assert result.exit_code == 0, result.stderr
    latency = json.loads(result.stdout)["latency"]
    assert latency["scheduler"]["policy"] == "priority"
    mixed = latency["mixed"]
    assert mixed["batch"] == {
        "in_flight": 8, "prompt_tokens": 1000, "output_tokens": 64, "priority": 1,
        "tenant": "batch",
    }  # fmt: skip
    assert mixed["interactive"]["requests"] == 10 and mixed["interactive"]["priority"] == -1
    assert mixed["interactive_start_s"] > 0  # after the batch's first wave is in
    points = {p["policy"]: p for p in mixed["policies"]}
    assert list(points) == ["fcfs", "priority", "fair"]
    for p in points.values():
        assert 0 < p["idle_ttft_p99"] <= p["ttft_p50"] <= p["ttft_p99"]
        assert p["ttft_p99_over_idle"] == p["ttft_p99"] / p["idle_ttft_p99"]
        assert p["batch_tokens_per_s"] > 0 and 0 < p["batch_share_of_alone"] <= 1.1
    rows = run(*args, "--scheduling-policy", "priority", "--background-decode-rows", "0", "--json")
    scheduler = json.loads(rows.stdout)["latency"]["scheduler"]
    assert latency["scheduler"]["background_decode_rows"] is None  # the engine's default
    assert scheduler["background_decode_rows"] == 0
    text = run(*args, "--interactive", "requests=10, start=30")
    assert text.exit_code == 0, text.stderr
    assert "Interactive latency (ms) under the batch load" in text.stdout
    assert "from 30.0 s" in text.stdout and "--mix 'interactive: max-concurrency=1" in text.stdout


def test_bad_mixed_class_options_are_one_clear_error(tmp_path: Path) -> None:
    profile = ("smollm2", "--vram", "8GiB", "--profile", str(write_profile(tmp_path)))
    for flags, fragment in (
        (CHATS, "--interactive describes the chats beside a --batch-load"),
        (("--batch-load", "prompt-tokens=10"), "--batch-load needs in-flight=N"),
        (("--batch-load", "in-flight=0"), "in-flight must lie in 1..4096"),
        ((*MIXED, "--interactive", "clients=two"), "clients='two' is not an integer"),
        ((*MIXED, "--interactive", "priority=5000"), "priority must lie in -1000..1000"),
        ((*MIXED, "--interactive", "start=-3"), "start must lie in 0..86400"),
        ((*MIXED, "--interactive", "think=1"), "'think=1' is not one of"),
        ((*MIXED, "--scheduling-policy", "lifo"), "one of fcfs, priority, fair, not 'lifo'"),
        ((*MIXED, "--long-prefill-token-threshold", "-1"), "0 (no cap) or more"),
        ((*MIXED, "--background-decode-rows", "-1"), "background decode rows must be 0"),
    ):
        result = run(*profile, *flags)
        assert result.exit_code == EXIT_BAD_INPUT, flags
        assert fragment in result.stderr and "Traceback" not in result.stderr, result.stderr
