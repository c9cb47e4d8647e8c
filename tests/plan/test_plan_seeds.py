"""The seeds' worked examples, reproduced with the planner's own functions.

Seed 000 sizes an "8B-class model" (32 layers, 8 KV heads, head_dim 128) as 8e9
parameters × bits / 8 on a 24 GB card, subtracting 14.9 GiB and 2.0 GiB from 24:
the card counts as 24 GiB (which an RTX 4090 is) and no utilization factor applies.
"""

from __future__ import annotations

from inhouse.plan.capacity import (
    kv_budget_bytes,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    max_concurrent_sequences,
)
from inhouse.plan.catalogue import catalogue_spec
from inhouse.plan.planner import PlanInputs, make_plan
from inhouse.plan.source import load_model
from inhouse.plan.spec import ModelSpec
from inhouse.plan.units import GIB, KIB, MIB

# Seed 000's model: only the facts it states (32 layers, 8 KV heads, head_dim 128).
SEED_8B = ModelSpec(
    name="seed-000-8B",
    num_layers=32,
    hidden_size=4096,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=14336,
    vocab_size=128256,
    tie_word_embeddings=False,
    max_position_embeddings=131072,
)
SEED_PARAMS = 8e9
CARD = 24 * GIB
OVERHEAD = 2 * GIB


def _seed_concurrency(bits: float, avg_context: int) -> int:
    weights = int(SEED_PARAMS * bits / 8)
    budget = kv_budget_bytes(CARD, 1.0, weights, OVERHEAD)
    return max_concurrent_sequences(budget, kv_bytes_per_sequence(SEED_8B, avg_context, "fp16"))


def test_seed000_kv_per_token_is_128_kib_and_per_sequence_500_mib() -> None:
    assert kv_bytes_per_token(SEED_8B, "fp16") == 128 * KIB
    assert kv_bytes_per_sequence(SEED_8B, 4000, "fp16") == 500 * MIB


def test_seed000_weights_and_room_left_for_kv() -> None:
    weights = int(SEED_PARAMS * 16 / 8)
    assert weights == 16_000_000_000  # "16.0 GB"
    assert round(weights / GIB, 1) == 14.9  # "-> 14.9 GiB"
    assert round(kv_budget_bytes(CARD, 1.0, weights, OVERHEAD) / GIB, 1) == 7.1  # "7.1 GiB"


def test_seed000_fp16_at_4000_tokens_gives_14_sequences() -> None:
    assert _seed_concurrency(16, 4000) == 14


def test_seed000_16k_context_costs_2_gib_per_sequence_and_drops_to_3() -> None:
    assert kv_bytes_per_sequence(SEED_8B, 16384, "fp16") == 2 * GIB
    assert _seed_concurrency(16, 16384) == 3


def test_seed000_4bit_weights_free_about_11_gib_and_give_over_35() -> None:
    freed = int(SEED_PARAMS * 16 / 8) - int(SEED_PARAMS * 4 / 8)
    assert round(freed / GIB) == 11
    assert _seed_concurrency(4, 4000) == 37  # "over 35"


def test_seed000_8bit_kv_cache_doubles_every_number() -> None:
    weights = int(SEED_PARAMS * 16 / 8)
    budget = kv_budget_bytes(CARD, 1.0, weights, OVERHEAD)
    fp8 = max_concurrent_sequences(budget, kv_bytes_per_sequence(SEED_8B, 4000, "fp8"))
    assert fp8 == 29  # 14.5 sequences of room doubled to 29
    assert kv_bytes_per_token(SEED_8B, "fp8") * 2 == kv_bytes_per_token(SEED_8B, "fp16")


def _llama_8b_plan(**options: object):
    inputs = PlanInputs(vram_bytes=CARD, util=1.0, overhead_bytes=OVERHEAD, **options)
    return make_plan(load_model("Llama-3.1-8B"), inputs)


def test_seed000_end_to_end_with_the_real_llama_3_1_8b() -> None:
    plan = _llama_8b_plan(avg_context=4000, weights="fp16")
    assert plan.kv_bytes_per_token == 128 * KIB
    assert plan.kv_bytes_per_sequence == 500 * MIB
    assert plan.max_concurrent == 14
    assert _llama_8b_plan(avg_context=16384, weights="fp16").max_concurrent == 3


def test_seed000_4bit_end_to_end_real_bits_per_weight() -> None:
    # GGUF Q4_0 (4.5 bits, embeddings quantized too) keeps the seed's "over 35" ...
    assert _llama_8b_plan(avg_context=4000, weights="q4_0").max_concurrent == 36
    # ... while AWQ's group scales and 16-bit embeddings/lm_head cost ~1.6 GB more: 34.
    assert _llama_8b_plan(avg_context=4000, weights="awq").max_concurrent == 34


def test_seed002_llama2_70b_kv_is_327680_bytes_per_token() -> None:
    spec = catalogue_spec("Llama-2-70B")
    assert kv_bytes_per_token(spec, "fp16") == 327_680
    # "4096 上下文 × 32 并发 ≈ 40GB"
    assert kv_bytes_per_sequence(spec, 4096, "fp16") * 32 == 40 * GIB


def test_seed004_64_layer_model_256_kib_per_token_2_gib_at_8k_8_gib_at_32k() -> None:
    spec = ModelSpec(
        name="seed-004-H3",
        num_layers=64,
        hidden_size=5120,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=25600,
        vocab_size=152064,
        tie_word_embeddings=False,
        max_position_embeddings=32768,
    )
    assert kv_bytes_per_token(spec, "bf16") == 256 * KIB
    assert kv_bytes_per_sequence(spec, 8192, "bf16") == 2 * GIB
    assert kv_bytes_per_sequence(spec, 32768, "bf16") == 8 * GIB
