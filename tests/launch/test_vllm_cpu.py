"""vLLM's flags on a CPU host: the KV budget in bytes (its CPU backend reads
--gpu-memory-utilization as a share of RAM and refuses to start), threads bound to each
replica's own cores, the AOT compile cache it cannot load back turned off; and on a GPU the
plan's five flags."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from inhouse.cli import app
from inhouse.launch.cpu_host import core_list, kv_share, split_cores
from inhouse.launch.settings import settings_from_plan
from inhouse.launch.vllm import VllmEngine
from inhouse.plan.planner import PlanInputs, make_plan
from inhouse.plan.source import load_model
from inhouse.plan.units import GIB


@pytest.mark.parametrize(
    ("cores", "replicas", "runs"),
    [
        ((0, 1), 2, [(0,), (1,)]),
        ((0, 1), 1, [(0, 1)]),
        ((0, 1, 2, 3, 4), 2, [(0, 1, 2), (3, 4)]),
        ((0, 1), 3, [(0,), (1,), (0,)]),
    ],
)
def test_replicas_split_the_cores(cores: tuple, replicas: int, runs: list) -> None:
    assert split_cores(cores, replicas) == runs


def test_core_lists_are_linux_cpu_lists() -> None:
    assert core_list((0,)) == "0"
    assert core_list((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"


def test_a_cpu_plan_gives_vllm_its_kv_bytes_and_cores_not_a_ram_share() -> None:
    plan = make_plan(load_model("llama-3.1-8b"), PlanInputs(vram_bytes=64 * GIB, cpu_cores=4))
    flags = VllmEngine().flags(settings_from_plan(plan))
    assert "--gpu-memory-utilization" not in flags.argv
    at = flags.argv.index("--kv-cache-memory-bytes")
    assert int(flags.argv[at + 1]) == plan.kv_budget > 0
    assert flags.env == {"VLLM_CPU_OMP_THREADS_BIND": "0-3", "VLLM_USE_AOT_COMPILE": "0"}


def test_plan_cpu_emit_vllm_prints_the_environment_and_the_bytes() -> None:
    result = CliRunner().invoke(app, ["plan", "llama-3.1-8b", "--cpu", "--ram", "64GiB",
                                      "--cores", "2", "--emit", "vllm"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output.startswith(
        "VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_USE_AOT_COMPILE=0 vllm serve Llama-3.1-8B"
    )
    assert "--kv-cache-memory-bytes" in result.output
    assert "--gpu-memory-utilization" not in result.output


def test_a_gpu_plan_gives_vllm_the_five_flags() -> None:
    plan = make_plan(load_model("llama-3.1-70b"), PlanInputs(gpu="A100-80G", tp=2))
    flags = VllmEngine().flags(settings_from_plan(plan))
    for option in ("--gpu-memory-utilization", "--max-num-seqs", "--max-model-len",
                   "--max-num-batched-tokens", "--tensor-parallel-size"):  # fmt: skip
        assert option in flags.argv
    assert "--kv-cache-memory-bytes" not in flags.argv and flags.env == {}


def test_without_a_plan_a_replica_gets_its_cores_share_of_free_memory() -> None:
    assert 0 < kv_share((0,)) <= kv_share(())
