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


# the engine's precision, and the bytes a value of its halves takes
EXACT = ({"dtype": "float32", "quantization": "none"}, 4)
BF16 = ({"dtype": "bfloat16"}, 2)
Q8 = ({"quantization": "q8"}, 1)


@pytest.mark.parametrize(
    ("folder_fixture", "slots", "rank", "precision"),
    [
        ("tiny_llama_folder", 3, 5, EXACT),
        ("tiny_llama_folder", 3, 5, BF16),
        ("tiny_llama_folder", 2, 8, Q8),
        ("tiny_qwen3_folder", 2, 16, BF16),
        ("tiny_qwen2_folder", 1, 1, EXACT),
        ("tiny_llama_uneven_folder", 2, 16, BF16),
    ],
)
def test_the_engines_slots_hold_what_the_plan_counts(
    folder_fixture, slots, rank, precision, request
):
    folder = request.getfixturevalue(folder_fixture)
    settings, value_bytes = precision
    config = EngineConfig(
        model=str(folder), max_model_len=64, kv_cache_memory=2**22, max_loras=slots,
        max_lora_rank=rank, **settings,
    )  # fmt: skip
    engine = LLMEngine(config)
    spec = load_model(str(folder)).spec
    assert engine.core.adapters.num_bytes == slots * inhouse_slot_bytes(spec, rank, value_bytes)
    memory = adapter_memory(spec, slots, rank)  # the plan counts bfloat16: int8's at most
    assert memory.inhouse_slot_bytes == inhouse_slot_bytes(spec, rank)
