"""`inhouse plan --emit ENGINE` for seed 000's 8B on 24 GiB and a TP=2 70B: golden files,
and every option we emit is one the engine documents, with a value it accepts; with --port,
the same command listening on 127.0.0.1."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inhouse.cli import app
from inhouse.launch import ENGINES
from inhouse.launch.base import Endpoint
from inhouse.launch.documented import documented_options, undocumented
from inhouse.launch.settings import settings_from_plan
from inhouse.plan.planner import PlanInputs, make_plan
from inhouse.plan.source import load_model
from inhouse.plan.units import GIB

GOLDEN = Path(__file__).parent / "golden"
SEED_8B = ["--vram", "24GiB", "--util", "1.0", "--overhead", "2GiB", "--avg-context", "4000"]
GOLDEN_PLANS = {
    "8b-24gib": ["llama-3.1-8b", *SEED_8B, "--weights", "fp16"],
    "70b-tp2": ["llama-3.1-70b", "--gpu", "A100-80G", "--tp", "2"],
}
# Plans that reach every branch of the flag code: quantized weights, 8-bit KV caches, TP.
PLANS = {
    "8b-24gib": ("llama-3.1-8b", PlanInputs(vram_bytes=24 * GIB, util=1.0, weights="fp16")),
    "70b-tp2": ("llama-3.1-70b", PlanInputs(gpu="A100-80G", tp=2)),
    "70b-awq-fp8kv": ("llama-3.1-70b", PlanInputs(gpu="H100", weights="awq", kv_dtype="fp8")),
    "8b-int8kv-fp8": ("llama-3.1-8b", PlanInputs(gpu="L4", weights="fp8", kv_dtype="int8")),
    "qwen-gptq-tp4": ("qwen2.5-72b", PlanInputs(gpu="L40S", weights="gptq", tp=4)),
    "8b-cpu": ("llama-3.1-8b", PlanInputs(vram_bytes=64 * GIB, cpu_cores=8)),
}
ENDPOINT = Endpoint("127.0.0.1", 8001, "served", api_key="secret")


@pytest.mark.parametrize("plan", sorted(GOLDEN_PLANS))
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_emit_matches_the_golden_file(engine: str, plan: str) -> None:
    result = CliRunner().invoke(app, ["plan", *GOLDEN_PLANS[plan], "--emit", engine])
    assert result.exit_code == 0, result.output
    golden = GOLDEN / f"{engine}-{plan}.txt"
    if os.environ.get("INHOUSE_UPDATE_GOLDEN"):
        golden.write_text(result.output)
    assert result.output == golden.read_text()


@pytest.mark.parametrize("plan", sorted(PLANS))
@pytest.mark.parametrize("engine", sorted(set(ENGINES) - {"inhouse"}))
def test_every_emitted_option_is_documented(engine: str, plan: str) -> None:
    name, inputs = PLANS[plan]
    settings = settings_from_plan(make_plan(load_model(name), inputs))
    launched = ENGINES[engine]
    flags = launched.flags(settings)
    launched.serving_flags(ENDPOINT, flags)
    assert undocumented(flags.argv, launched.documented) == []


def test_the_check_catches_an_unknown_option_and_a_bad_value() -> None:
    assert undocumented(["--tp", "2", "--kv-cache-dtype", "int8"], "vllm.txt") == [
        "--tp",
        "--kv-cache-dtype int8",
    ]
    assert documented_options("sglang.txt")["--tp-size"] is None


def test_what_an_engine_lacks_is_said() -> None:
    plan = make_plan(load_model("llama-3.1-8b"), PlanInputs(gpu="L4", kv_dtype="int8", tp=2))
    settings = settings_from_plan(plan)
    notes = {name: " ".join(engine.flags(settings).notes) for name, engine in ENGINES.items()}
    assert "no int8 KV cache" in notes["vllm"] and "no int8 KV cache" in notes["sglang"]
    assert "no tensor parallelism" in notes["inhouse"]
    assert "no tensor parallelism" in notes["llama.cpp"] and "GGUF" in notes["llama.cpp"]


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_emit_with_a_port_is_the_golden_command_listening_on_loopback(engine: str) -> None:
    argv = ["plan", *GOLDEN_PLANS["8b-24gib"], "--emit", engine, "--port", "8123"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    golden = (GOLDEN / f"{engine}-8b-24gib.txt").read_text()
    assert "--port" not in golden
    assert result.output == golden.rstrip("\n") + " \\\n  --host 127.0.0.1 \\\n  --port 8123\n"
