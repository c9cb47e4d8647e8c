"""`inhouse plan --cpu`'s `inhouse serve` command, started as printed, runs the very path
serve chooses by itself on this host (dtype and weight format in its /version), and the
path the plan names: for the bundled GGUF and for an HF folder."""

from __future__ import annotations

import shlex
from pathlib import Path

import httpx
import pytest
import torch
from typer.testing import CliRunner

from inhouse.cli import app
from inhouse.engine.models.precision import choose_precision
from inhouse.launch.inhouse import planned_path
from inhouse.plan.planner import PlanInputs, make_plan
from inhouse.plan.source import load_model
from inhouse.plan.units import parse_bytes
from serving import SERVE_KEY, Process, free_port, inhouse_command, wait_healthy
from tiny_models import TINY_COMMON, save_tiny

pytestmark = pytest.mark.slow
RAM = "2GiB"  # the plan's --ram: a KV budget (~0.7 GiB) a shared test host can spare


def printed_serve_args(model: str) -> list[str]:
    """What follows `inhouse serve` in `inhouse plan MODEL --cpu --emit inhouse`."""
    result = CliRunner().invoke(app, ["plan", model, "--cpu", "--ram", RAM, "--emit", "inhouse"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if not line.startswith("#")]
    argv = shlex.split(" ".join(line.rstrip("\\") for line in lines))
    assert argv[:2] == ["inhouse", "serve"], result.stdout
    return argv[2:]


def served_path(args: list[str], log: Path) -> dict:
    """Start `inhouse serve ARGS` on a free port; its /version once ready."""
    port = free_port()
    command = [*inhouse_command(), "serve", *args, "--port", str(port), "--embedding-model", "none"]
    process = Process(command, log, {"INHOUSE_API_KEY": SERVE_KEY})
    process.start()
    try:
        assert process.popen is not None
        wait_healthy(f"http://127.0.0.1:{port}/health", process.popen, log, 600)
        return httpx.get(f"http://127.0.0.1:{port}/version", timeout=10).json()
    finally:
        process.stop()


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    from transformers import LlamaConfig

    config = LlamaConfig(**TINY_COMMON, tie_word_embeddings=False, torch_dtype="bfloat16")
    return save_tiny(tmp_path_factory.mktemp("tiny-bf16"), config, seed=3)


@pytest.mark.parametrize("source", ["gguf", "hf"])
def test_the_plans_serve_command_runs_serves_own_path(source: str, hf_folder, tmp_path) -> None:
    model = load_model(None if source == "gguf" else hf_folder)
    args = printed_serve_args(model.reference)
    assert "--dtype" not in args and "--quantization" not in args
    info = served_path(args, tmp_path / "serve.log")
    blocks = "Q4_1" if source == "gguf" else None
    own = choose_precision("auto", "auto", torch.device("cpu"), source_blocks=blocks)
    assert info["dtype"] == str(own.dtype).removeprefix("torch.")
    assert (info["quantization"], info["path_reason"]) == (own.quantization, own.reason)
    named = planned_path(make_plan(model, PlanInputs(vram_bytes=parse_bytes(RAM), cpu_cores=2)))
    assert named is not None and (named.dtype, named.quantization) == (
        info["dtype"],
        info["quantization"],
    )
