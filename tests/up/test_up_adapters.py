"""`inhouse up --lora-modules/--max-loras/--max-lora-rank`: every replica's settings carry the
adapters (paths made absolute), the plan counts their slots, and the gateway config declares
them on each chat backend (the e2e runs: test_up_vllm_lora.py, test_up_lora_e2e.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from inhouse.launch import ENGINES
from inhouse.launch.base import Command, Endpoint, LaunchSettings
from inhouse.launch.replicas import Replica
from inhouse.plan.errors import PlanError
from inhouse.up.gateway_config import up_config
from inhouse.up.settings import AdapterOptions, launch_settings, plan_inputs


def test_options_resolve_local_paths_and_count_slots(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "support").mkdir()
    monkeypatch.chdir(tmp_path)
    options = AdapterOptions.parse(["support=support", "code=org/code-lora"], None, None)
    assert options.modules == (("support", str(tmp_path / "support")), ("code", "org/code-lora"))
    assert (options.slots, options.names) == (4, ("support", "code"))
    settings = options.apply(LaunchSettings(model="m"))
    assert (settings.lora_modules, settings.max_loras, settings.max_lora_rank) == (
        options.modules, 4, 16,
    )  # fmt: skip
    assert AdapterOptions.parse([], None, None).apply(LaunchSettings(model="m")).max_loras == 0
    assert AdapterOptions.parse([], 2, 8).apply(LaunchSettings(model="m")).max_loras == 2
    for values, slots, rank in [(["a=/1", "b=/2"], 1, None), (["bad"], None, None), ([], 1, 0)]:
        with pytest.raises(PlanError):
            AdapterOptions.parse(values, slots, rank)


def test_a_planned_up_takes_the_slots_from_the_kv_budget() -> None:
    options = AdapterOptions.parse(["support=/a"], None, 32)
    plain = launch_settings("llama-3.1-8b", plan_inputs(
        "L40S", None, 1, 0.9, None, None, "auto", None, AdapterOptions()), None, None)  # fmt: skip
    tuned = options.apply(launch_settings("llama-3.1-8b", plan_inputs(
        "L40S", None, 1, 0.9, None, None, "auto", None, options), None, None))  # fmt: skip
    assert tuned.kv_cache_bytes < plain.kv_cache_bytes
    assert (tuned.max_loras, tuned.max_lora_rank) == (4, 32)
    assert plan_inputs(None, None, 1, 0.9, None, None, "auto", None, options) is None


def test_the_gateway_declares_the_adapters_on_every_chat_backend(tmp_path: Path) -> None:
    engine = ENGINES["vllm"]
    popen = subprocess.Popen(["true"])
    popen.wait()
    started = [
        Replica(engine, i, Endpoint("127.0.0.1", 9000 + i, "m", "k"), Command([]), popen)
        for i in (1, 2)
    ]
    database = f"sqlite:///{tmp_path / 'g.db'}"
    config = up_config("m", engine, started, "127.0.0.1", 8000, database, False,
                       adapters=("support", "code"))  # fmt: skip
    (model,) = config.models
    assert [set(b.adapters) for b in model.backends] == [{"support", "code"}] * 2
    assert model.adapters == {"support", "code"}
    bare = up_config("m", engine, started, "127.0.0.1", 8000, database, False)
    assert bare.models[0].adapters == frozenset()
