"""LoRA adapters in each engine's command: inhouse repeats --lora-modules, vLLM takes one
list after --enable-lora, SGLang its --lora-paths, llama.cpp none (a note, never a silent
drop); every option emitted is one the engine documents."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from inhouse.cli import app
from inhouse.launch import ENGINES
from inhouse.launch.base import Endpoint, Flags, LaunchSettings
from inhouse.launch.documented import undocumented
from inhouse.launch.settings import settings_from_plan
from inhouse.plan.planner import PlanInputs, make_plan
from inhouse.plan.source import load_model

MODULES = (("support", "/adapters/support"), ("code", "/adapters/code"))
ENDPOINT = Endpoint("127.0.0.1", 8001, "served")


def _settings(**inputs) -> LaunchSettings:
    plan = make_plan(load_model("llama-3.1-8b"), PlanInputs(gpu="L40S", **inputs))
    return settings_from_plan(plan)


def _flags(engine: str, settings: LaunchSettings) -> Flags:
    launched = ENGINES[engine]
    flags = launched.flags(settings)
    launched.serving_flags(ENDPOINT, flags)
    return flags


def _after(argv: list[str], option: str, count: int = 1) -> list[str]:
    start = argv.index(option) + 1
    return argv[start : start + count]


def test_the_plan_hands_the_adapters_and_slots_to_every_engine() -> None:
    settings = _settings(lora_modules=MODULES, max_lora_rank=12)
    assert (settings.lora_modules, settings.max_loras, settings.max_lora_rank) == (MODULES, 4, 12)
    assert _settings().max_loras == 0 and _settings().max_lora_rank is None


def test_inhouse_repeats_lora_modules() -> None:
    argv = _flags("inhouse", _settings(lora_modules=MODULES)).argv
    pairs = [argv[i + 1] for i, token in enumerate(argv) if token == "--lora-modules"]
    assert pairs == ["support=/adapters/support", "code=/adapters/code"]
    assert _after(argv, "--max-loras") == ["4"] and _after(argv, "--max-lora-rank") == ["16"]


def test_vllm_enables_lora_with_one_list_and_a_rank_it_takes() -> None:
    flags = _flags("vllm", _settings(lora_modules=MODULES, max_lora_rank=12))
    argv = flags.argv
    assert "--enable-lora" in argv and argv.count("--lora-modules") == 1
    assert _after(argv, "--lora-modules", 2) == ["support=/adapters/support", "code=/adapters/code"]
    assert _after(argv, "--max-loras") == ["4"]
    assert _after(argv, "--max-lora-rank") == ["16"]  # 12 is no choice of vLLM's
    assert flags.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"  # the gateway's loads
    assert undocumented(argv, "vllm.txt") == []
    huge = _flags("vllm", _settings(max_loras=1, max_lora_rank=1024))
    assert "--max-lora-rank" not in huge.argv and "--lora-modules" not in huge.argv
    assert any("no LoRA rank above 512" in note for note in huge.notes)


def test_sglang_takes_lora_paths() -> None:
    argv = _flags("sglang", _settings(lora_modules=MODULES)).argv
    assert "--enable-lora" in argv
    assert _after(argv, "--lora-paths", 2) == ["support=/adapters/support", "code=/adapters/code"]
    assert _after(argv, "--max-loras-per-batch") == ["4"]
    assert undocumented(argv, "sglang.txt") == []


def test_llama_cpp_notes_the_adapters_it_cannot_take() -> None:
    settings = dataclasses.replace(_settings(lora_modules=MODULES), gguf=True)
    flags = _flags("llama.cpp", settings)
    assert not [t for t in flags.argv if "lora" in t]
    (note,) = [n for n in flags.notes if "LoRA" in n]
    assert "GGUF" in note and "support, code not passed" in note


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_no_adapter_no_lora_flag(engine: str) -> None:
    flags = _flags(engine, _settings())
    assert not [t for t in flags.argv if "lora" in t]
    assert not [n for n in flags.notes if "LoRA" in n]


def test_plan_emit_prints_them() -> None:
    args = ["plan", "llama-3.1-8b", "--gpu", "L40S", "--lora-modules", "support=/a"]
    args += ["--lora-modules", "code=/b"]
    vllm = CliRunner().invoke(app, [*args, "--emit", "vllm"])
    assert vllm.exit_code == 0, vllm.output
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve" in vllm.output
    assert "  --enable-lora \\\n  --lora-modules support=/a code=/b \\\n" in vllm.output
    inhouse = CliRunner().invoke(app, [*args, "--max-loras", "6", "--emit", "inhouse"])
    assert "  --lora-modules support=/a \\\n  --lora-modules code=/b \\\n" in inhouse.output
    assert "--max-loras 6" in inhouse.output
