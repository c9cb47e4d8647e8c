"""KV cache arithmetic: GQA vs MHA, explicit head_dim, MLA, sliding windows, TP, blocks."""

from __future__ import annotations

import dataclasses

import pytest

from inhouse.plan.capacity import (
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    kv_cache_capacity,
    kv_heads_per_gpu,
    largest_context,
)
from inhouse.plan.catalogue import catalogue_spec
from inhouse.plan.errors import PlanError
from inhouse.plan.units import GIB, KIB


def test_gqa_caches_a_quarter_of_what_the_same_model_as_mha_would() -> None:
    gqa = catalogue_spec("Llama-3.1-8B")
    mha = dataclasses.replace(gqa, num_key_value_heads=gqa.num_attention_heads)
    assert gqa.attention_kind == "GQA" and mha.attention_kind == "MHA"
    assert kv_bytes_per_token(gqa) == 128 * KIB
    assert kv_bytes_per_token(mha) == 512 * KIB


def test_explicit_head_dim_wins_over_hidden_over_heads() -> None:
    qwen3_moe = catalogue_spec("Qwen3-30B-A3B")  # hidden 2048 / 32 heads = 64, head_dim 128
    assert kv_bytes_per_token(qwen3_moe) == 2 * 48 * 4 * 128 * 2
    gemma = catalogue_spec("Gemma-2-9B")  # 3584 / 16 = 224, head_dim 256
    assert kv_bytes_per_token(gemma) == 2 * 42 * 8 * 256 * 2


def test_mla_caches_latent_plus_rope_per_layer_without_factor_two() -> None:
    deepseek = catalogue_spec("DeepSeek-V3")
    assert deepseek.attention_kind == "MLA"
    assert kv_bytes_per_token(deepseek, "bf16") == (512 + 64) * 61 * 2 == 70_272
    # As if it had 128 full K/V heads of 192/128 dims it would be ~70x more.
    assert kv_bytes_per_token(deepseek, "fp8") == 576 * 61


def test_mla_latent_is_replicated_not_split_by_tensor_parallel() -> None:
    deepseek = catalogue_spec("DeepSeek-V3")
    assert kv_bytes_per_token(deepseek, tp=8) == kv_bytes_per_token(deepseek, tp=1)


def test_sliding_layers_stop_growing_at_the_window() -> None:
    gemma = catalogue_spec("Gemma-2-9B")  # 21 of 42 layers slide over 4096 tokens
    per_layer = 2 * 8 * 256 * 2
    assert kv_bytes_per_sequence(gemma, 2048) == 42 * 2048 * per_layer
    assert kv_bytes_per_sequence(gemma, 8192) == (21 * 8192 + 21 * 4096) * per_layer
    uncapped = kv_bytes_per_token(gemma) * 8192
    assert kv_bytes_per_sequence(gemma, 8192) == uncapped * 3 // 4


def test_largest_context_inverts_the_sliding_window_cost() -> None:
    gemma = catalogue_spec("Gemma-2-9B")
    budget = kv_bytes_per_sequence(gemma, 6000)
    assert largest_context(gemma, budget) == 6000
    assert largest_context(gemma, kv_bytes_per_sequence(gemma, 3000)) == 3000


def test_every_layer_sliding_means_memory_stops_at_the_window() -> None:
    mistral = catalogue_spec("Mistral-7B")
    assert kv_bytes_per_sequence(mistral, 32768) == kv_bytes_per_sequence(mistral, 4096)
    assert largest_context(mistral, 1 * GIB) == mistral.max_position_embeddings


def test_tensor_parallel_splits_kv_heads_per_gpu() -> None:
    llama = catalogue_spec("Llama-3.1-70B")  # 64 heads, 8 KV heads
    assert kv_bytes_per_token(llama, tp=2) == kv_bytes_per_token(llama) // 2
    assert kv_heads_per_gpu(llama, 8) == 1


def test_tp_beyond_kv_heads_replicates_one_head_per_gpu() -> None:
    qwen = catalogue_spec("Qwen2.5-7B")  # 28 heads, 4 KV heads
    assert kv_heads_per_gpu(qwen, 4) == 1
    llama = catalogue_spec("Llama-3.1-70B")  # 64 heads, 8 KV heads
    assert kv_heads_per_gpu(llama, 16) == 1


def test_tp_that_does_not_divide_kv_heads_is_refused() -> None:
    spec = dataclasses.replace(catalogue_spec("Llama-3.1-8B"), num_attention_heads=48)
    with pytest.raises(PlanError, match="does not divide the 8 KV heads"):
        kv_heads_per_gpu(spec, 3)  # seed 004: 8 KV heads on 3 cards cannot work


def test_tp_that_does_not_divide_attention_heads_is_refused() -> None:
    with pytest.raises(PlanError, match="does not divide the 32 attention heads"):
        kv_bytes_per_token(catalogue_spec("Llama-3.1-8B"), tp=3)


def test_kv_cache_capacity_follows_vllms_startup_arithmetic() -> None:
    capacity = kv_cache_capacity(
        kv_cache_bytes=7 * GIB, kv_bytes_per_token=128 * KIB, block_size=16, max_model_len=8192
    )
    assert capacity.num_blocks == 7 * GIB // (128 * KIB * 16) == 3584
    assert capacity.num_tokens == 3584 * 16
    assert capacity.max_concurrency == pytest.approx(3584 / 512)


def test_kv_cache_capacity_rounds_a_partial_block_up_per_request() -> None:
    capacity = kv_cache_capacity(1000 * 16 * 100, 1000, block_size=16, max_model_len=17)
    assert capacity.num_blocks == 100
    assert capacity.max_concurrency == 50.0  # 17 tokens need 2 blocks


def test_unknown_kv_dtype_is_refused() -> None:
    with pytest.raises(PlanError, match="unknown KV cache dtype 'fp4'"):
        kv_bytes_per_token(catalogue_spec("Llama-3.1-8B"), "fp4")
