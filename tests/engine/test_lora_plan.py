"""The plan's adapter memory is the engine's: ``AdapterSlots.num_bytes`` of a real engine
equals ``inhouse.plan.adapters`` for the same model, slots and rank."""

from __future__ import annotations

import pytest

from inhouse.engine.config import EngineConfig
from inhouse.engine.engine import LLMEngine
from inhouse.plan.adapters import adapter_memory, inhouse_slot_bytes
from inhouse.plan.source import load_model


@pytest.mark.parametrize(
    ("folder_fixture", "slots", "rank"),
    [("tiny_llama_folder", 3, 5), ("tiny_qwen3_folder", 2, 16), ("tiny_qwen2_folder", 1, 1)],
)
def test_the_engines_slots_hold_what_the_plan_counts(folder_fixture, slots, rank, request):
    folder = request.getfixturevalue(folder_fixture)
    config = EngineConfig(
        model=str(folder), dtype="float32", max_model_len=64, kv_cache_memory=2**22,
        max_loras=slots, max_lora_rank=rank,
    )  # fmt: skip
    engine = LLMEngine(config)
    spec = load_model(str(folder)).spec
    memory = adapter_memory(spec, slots, rank)
    assert engine.core.adapters.num_bytes == slots * inhouse_slot_bytes(spec, rank)
    assert memory.inhouse_slot_bytes == inhouse_slot_bytes(spec, rank)
    assert memory.total >= engine.core.adapters.num_bytes  # the larger of two layouts
