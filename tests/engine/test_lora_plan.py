"""The plan's adapter memory is the engine's: ``AdapterSlots.num_bytes`` of a real engine
equals ``inhouse.plan.adapters`` for the same model, slots and rank, with bfloat16 halves
(what a plan starts) and float32 ones (an exact engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inhouse.engine.config import EngineConfig
from inhouse.engine.engine import LLMEngine
from inhouse.plan.adapters import adapter_memory, inhouse_slot_bytes
from inhouse.plan.source import load_model
from tiny_models import TINY_COMMON, save_tiny


@pytest.fixture(scope="module")
def tiny_llama_uneven_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama with an MLP of 40: the up part starts inside a block of 16 outputs."""
    from transformers import LlamaConfig

    config = LlamaConfig(**{**TINY_COMMON, "intermediate_size": 40}, tie_word_embeddings=False)
    return save_tiny(tmp_path_factory.mktemp("tiny-llama-uneven"), config, seed=5)


@pytest.mark.parametrize(
    ("folder_fixture", "slots", "rank", "exact"),
    [
        ("tiny_llama_folder", 3, 5, True),
        ("tiny_llama_folder", 3, 5, False),
        ("tiny_qwen3_folder", 2, 16, False),
        ("tiny_qwen2_folder", 1, 1, True),
        ("tiny_llama_uneven_folder", 2, 16, False),
    ],
)
def test_the_engines_slots_hold_what_the_plan_counts(folder_fixture, slots, rank, exact, request):
    folder = request.getfixturevalue(folder_fixture)
    dtype = {"dtype": "float32", "quantization": "none"} if exact else {"dtype": "bfloat16"}
    config = EngineConfig(
        model=str(folder), max_model_len=64, kv_cache_memory=2**22, max_loras=slots,
        max_lora_rank=rank, **dtype,
    )  # fmt: skip
    engine = LLMEngine(config)
    spec = load_model(str(folder)).spec
    assert engine.core.adapters.num_bytes == slots * inhouse_slot_bytes(spec, rank, exact)
    memory = adapter_memory(spec, slots, rank)
    assert memory.inhouse_slot_bytes == inhouse_slot_bytes(spec, rank, exact=False)
