"""`inhouse plan --lora-modules/--max-loras/--max-lora-rank`: the adapter slots' memory, by
each engine's layout, taken from the KV budget (the engine's own count:
tests/engine/test_lora_plan.py)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from inhouse.cli import app
from inhouse.plan.adapters import (
    default_max_loras,
    parse_lora_modules,
    vllm_rank,
    vllm_slot_bytes,
)
from inhouse.plan.errors import PlanError
from inhouse.plan.planner import PlanInputs, make_plan
from inhouse.plan.source import load_model
from inhouse.plan.units import GIB

LLAMA_8B = load_model("llama-3.1-8b")


def test_vllm_slot_is_its_stacks_in_16_bits_per_slice_plus_embeddings_and_lm_head() -> None:
    spec = LLAMA_8B.spec  # hidden 4096, q 4096, kv 1024, mlp 14336, vocab 128256, 32 layers
    r = 16
    qkv = 3 * r * 4096 + r * (4096 + 1024 + 1024)
    o = r * 4096 + 4096 * r
    gate_up = 2 * r * 4096 + r * 2 * 14336
    down = r * 14336 + 4096 * r
    vocab = 2 * (128256 + 4096) * r
    assert vllm_slot_bytes(spec, r) == (32 * (qkv + o + gate_up + down) + vocab) * 2
    assert vllm_slot_bytes(spec, 12) == vllm_slot_bytes(spec, 16)  # vLLM's rank choices
    assert vllm_slot_bytes(spec, 16, tp=2) < vllm_slot_bytes(spec, 16)


def test_vllm_ranks_round_up_to_its_choices() -> None:
    assert [vllm_rank(r) for r in (1, 2, 8, 9, 64, 300, 512, 513)] == [
        1, 8, 8, 16, 64, 320, 512, None,
    ]  # fmt: skip


def test_slots_default_as_serve_counts_them() -> None:
    assert default_max_loras(0, None) == 0
    assert default_max_loras(2, None) == 4
    assert default_max_loras(6, None) == 6
    assert default_max_loras(0, 3) == 3
    with pytest.raises(PlanError, match="fewer than the 2"):
        default_max_loras(2, 1)


def test_lora_modules_read_as_vllm_spells_them() -> None:
    modules = parse_lora_modules(["support=/a", '{"name": "code", "path": "/b"}'])
    assert modules == {"support": "/a", "code": "/b"}
    for bad, match in [(["x"], "not name=path"), (["a=/1", "a=/2"], "given twice")]:
        with pytest.raises(PlanError, match=match):
            parse_lora_modules(bad)


def test_the_slots_come_out_of_the_kv_budget() -> None:
    plain = make_plan(LLAMA_8B, PlanInputs(gpu="L40S"))
    modules = (("support", "/a"), ("code", "/b"))
    planned = make_plan(LLAMA_8B, PlanInputs(gpu="L40S", lora_modules=modules))
    memory = planned.adapters
    assert (memory.slots, memory.max_rank) == (4, 16)
    assert memory.slot_bytes == max(memory.inhouse_slot_bytes, memory.vllm_slot_bytes)
    # vLLM's: its bf16 stacks and embedding rows outweigh inhouse's float32 halves, whose B
    # blocks each hold one part's rank rows
    assert memory.slot_bytes == memory.vllm_slot_bytes > memory.inhouse_slot_bytes
    assert plain.adapters.total == 0
    assert plain.kv_budget - planned.kv_budget == memory.total == 4 * memory.slot_bytes
    wider = make_plan(LLAMA_8B, PlanInputs(gpu="L40S", max_loras=8, max_lora_rank=64))
    assert wider.adapters.total > 4 * memory.total


def test_adapters_that_leave_no_room_say_so() -> None:
    plan = make_plan(
        LLAMA_8B, PlanInputs(vram_bytes=18 * GIB, util=1.0, max_loras=64, max_lora_rank=256)
    )
    assert not plan.fits and "adapter slots" in plan.reason


def test_cli_report_json_and_bad_input() -> None:
    runner = CliRunner()
    args = ["plan", "llama-3.1-8b", "--gpu", "L40S", "--lora-modules", "support=/a"]
    report = runner.invoke(app, [*args, "--explain"])
    assert report.exit_code == 0, report.output
    assert "adapters" in report.output and "− overhead − adapters" in report.output
    assert "--lora-modules support=/a" in report.output  # the recommended commands
    document = json.loads(runner.invoke(app, [*args, "--max-lora-rank", "8", "--json"]).output)
    adapters = document["adapters"]
    assert (adapters["max_loras"], adapters["max_lora_rank"]) == (4, 8)
    assert adapters["total_bytes"] == 4 * adapters["slot_bytes"]
    flags = document["flags"]["vllm_serve"]
    assert flags[flags.index("--lora-modules") + 1] == "support=/a"
    bad = runner.invoke(app, ["plan", "--lora-modules", "nopath"])
    assert bad.exit_code == 2 and "not name=path" in bad.output
    few = runner.invoke(app, [*args, "--lora-modules", "code=/b", "--max-loras", "1"])
    assert few.exit_code == 2 and "fewer than the 2" in few.output
