"""Real bits per weight, and weight bytes by format."""

from __future__ import annotations

import gguf
import pytest

from inhouse.plan.catalogue import catalogue_spec
from inhouse.plan.errors import PlanError
from inhouse.plan.formats import weight_format
from inhouse.plan.weights import weight_bytes


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0", "Q6_K"])
def test_gguf_bits_per_weight_match_ggml_block_sizes(name: str) -> None:
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
    assert weight_format(name).linear_bits == size * 8 / block


def test_awq_counts_group_128_scales_and_zeros() -> None:
    assert weight_format("awq").linear_bits == pytest.approx(4.156, abs=0.001)
    assert weight_format("gptq").linear_bits > weight_format("awq").linear_bits


def test_awq_keeps_embeddings_and_lm_head_16_bit() -> None:
    spec = catalogue_spec("Llama-3.1-8B")
    counts = spec.param_counts()
    awq = weight_bytes(spec, weight_format("awq"))
    expected = (
        counts.linear * (4 + 20 / 128)
        + (counts.embedding + counts.lm_head) * 16
        + counts.other * 16
    ) / 8
    assert awq.total == round(expected)
    assert awq.embedding == counts.embedding * 2


def test_bf16_is_two_bytes_per_parameter() -> None:
    spec = catalogue_spec("Qwen3-8B")
    assert weight_bytes(spec, weight_format("bf16")).total == 2 * spec.total_params


def test_moe_weights_include_every_expert_but_decode_reads_only_active_ones() -> None:
    spec = catalogue_spec("Qwen3-30B-A3B")
    weights = weight_bytes(spec, weight_format("bf16"))
    assert weights.total == 2 * spec.total_params
    read = weights.read_per_step(spec)
    # active params less the input embedding table (one row is read per token)
    assert read == 2 * (spec.active_params - spec.param_counts().embedding)


def test_tied_embedding_table_is_read_in_full_as_the_lm_head() -> None:
    spec = catalogue_spec("SmolLM2-135M")
    weights = weight_bytes(spec, weight_format("bf16"))
    assert weights.read_per_step(spec) == weights.total


@pytest.mark.parametrize("alias", ["BF16", "bfloat16", "Q4_K_M", "q4-k-m", "int4"])
def test_format_names_are_forgiving(alias: str) -> None:
    assert weight_format(alias).name in {"bf16", "q4_k_m", "awq"}


def test_unknown_format_lists_the_known_ones() -> None:
    with pytest.raises(PlanError, match="unknown weight format 'nf3'; known formats: bf16"):
        weight_format("nf3")


def test_a_moe_batch_touches_more_experts_than_one_token() -> None:
    spec = catalogue_spec("Qwen3-30B-A3B")  # 8 of 128 experts per token
    weights = weight_bytes(spec, weight_format("bf16"))
    one, many = weights.read_per_step(spec, 1), weights.read_per_step(spec, 64)
    untouched = (1 - 8 / 128) ** 64 * weights.routed_experts
    assert many == weights.total - weights.embedding - int(untouched)
    assert one < many < weights.total
