"""A --cpu plan recommends the path `inhouse serve` takes by itself: no --dtype (an explicit
one runs the checkpoint's weights in torch matmuls, ~6x slower, or ~2x on the kernels' bf16
tiles or vdpbf16ps), and it says which path; serve's own rule (plan.serve_path) says what
an explicit bf16 costs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from published_configs import LLAMA_3_1_8B
from typer.testing import CliRunner

from inhouse.cli import app
from inhouse.launch.emit import plan_flags
from inhouse.launch.inhouse import planned_path
from inhouse.plan.planner import PlanInputs, make_plan
from inhouse.plan.serve_path import Host, choose_path
from inhouse.plan.source import load_model
from inhouse.plan.units import GIB

SLOWING_FLAGS = ("--dtype", "--quantization")


@pytest.fixture
def hf_folder(tmp_path: Path) -> Path:
    """A bf16 HF checkpoint's folder, as the plan reads it (config.json)."""
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_3_1_8B))
    return tmp_path


@pytest.mark.parametrize("source", ["gguf", "hf"])
def test_a_cpu_plan_gives_inhouse_serve_no_flag_that_slows_it(source: str, hf_folder) -> None:
    model = load_model(None if source == "gguf" else hf_folder)
    cpu = make_plan(model, PlanInputs(vram_bytes=32 * GIB, cpu_cores=2))
    argv = plan_flags("inhouse", cpu).argv
    assert not set(SLOWING_FLAGS) & set(argv), argv
    gpu = make_plan(model, PlanInputs(gpu="L40S"))  # a GPU plan still names its dtype
    assert "--dtype" in plan_flags("inhouse", gpu).argv


def test_the_plan_names_serves_own_path_q4_for_the_bundled_gguf_q8_for_a_folder(
    hf_folder,
) -> None:
    inputs = PlanInputs(vram_bytes=32 * GIB, cpu_cores=2)
    gguf = planned_path(make_plan(load_model(None), inputs))
    folder = planned_path(make_plan(load_model(hf_folder), inputs))
    assert gguf is not None and (gguf.dtype, gguf.quantization) == ("float32", "q4")
    assert folder is not None and (folder.dtype, folder.quantization) == ("float32", "q8")
    assert planned_path(make_plan(load_model(hf_folder), PlanInputs(gpu="L40S"))) is None


def test_plan_cpu_prints_the_path_and_a_command_without_dtype() -> None:
    result = CliRunner().invoke(app, ["plan", "--cpu", "--ram", "4GiB"])
    assert result.exit_code == 0, result.output
    inhouse = result.stdout.split("inhouse serve ", 1)[1].split("vllm serve", 1)[0]
    assert "--dtype" not in inhouse and "--max-num-seqs" in inhouse
    assert "inhouse serve on a CPU takes its own fastest path, so no --dtype: q4" in result.stdout


def test_an_explicit_bf16_says_what_it_costs_where_the_kernels_run() -> None:
    with_kernels = Host(kernels_isa="avx512-vnni", fbgemm=True)  # an AVX-512 CPU without bf16
    bf16 = choose_path("bfloat16", "auto", with_kernels)
    assert (bf16.dtype, bf16.quantization) == ("bfloat16", "none")
    assert "~6x slower a token at one stream than the default (q8 weights" in bf16.reason
    assert "batch-invariant row blocks" in bf16.reason and "drop --dtype" in bf16.reason
    gguf = choose_path("bf16", "auto", with_kernels, source_blocks="Q4_1")
    assert "the default (q4 weights" in gguf.reason
    fp32 = choose_path("float32", "auto", with_kernels)
    assert "slower than the default (q8" in fp32.reason and "~6x" not in fp32.reason
    tiles = choose_path("bfloat16", "auto", Host(kernels_isa="avx512-amx", native_bf16=True))
    assert (tiles.dtype, tiles.quantization) == ("bfloat16", "none")
    assert "AMX bf16 tiles, one order at any row count; ~2x slower a token" in tiles.reason
    zen4 = Host(kernels_isa="avx512-vnni", native_bf16=True, fbgemm=True)
    chains = choose_path("bfloat16", "auto", zen4).reason
    assert "AVX-512 BF16 (vdpbf16ps), one order at any row count; ~2x slower a token" in chains
    capped = choose_path("bfloat16", "auto", Host(kernels_isa="avx2", native_bf16=True))
    assert "batch-invariant row blocks" in capped.reason
    without = choose_path("bfloat16", "auto", Host(native_bf16=True, fbgemm=True))
    assert "slower" not in without.reason  # nothing faster to compare it with
