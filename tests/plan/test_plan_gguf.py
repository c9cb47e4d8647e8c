"""The bundled SmolLM2 GGUF, read from its header only."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from inhouse.manifests.bundled import default_chat_model
from inhouse.plan.capacity import kv_bytes_per_token
from inhouse.plan.catalogue import catalogue_spec
from inhouse.plan.errors import PlanError
from inhouse.plan.gguf_header import GgufModel, read_gguf
from inhouse.plan.source import load_model
from inhouse.plan.weights import gguf_weight_bytes


@pytest.fixture(scope="module")
def bundled() -> GgufModel:
    return read_gguf(default_chat_model())


def test_header_gives_smollm2_architecture(bundled: GgufModel) -> None:
    spec = bundled.spec
    assert spec.num_layers == 30
    assert spec.num_key_value_heads == 3
    assert spec.head_dim == 64
    assert spec.num_attention_heads == 9
    assert spec.hidden_size == 576
    assert spec.vocab_size == 49152
    assert spec.tie_word_embeddings  # no output.weight tensor
    assert spec.max_position_embeddings == 8192


def test_header_spec_matches_the_catalogue_architecture(bundled: GgufModel) -> None:
    catalogue = catalogue_spec("SmolLM2-135M")
    assert bundled.spec.total_params == catalogue.total_params == 134_515_008
    assert kv_bytes_per_token(bundled.spec) == kv_bytes_per_token(catalogue) == 23_040


def test_tensors_are_q4_1_with_real_byte_sizes(bundled: GgufModel) -> None:
    tensors = bundled.tensors
    assert tensors.main_type == "Q4_1"
    assert tensors.tensors_by_type["Q4_1"] == 210  # 7 linear tensors × 30 layers
    assert sum(tensors.tensors_by_type.values()) == 272
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q4_1]
    assert size * 8 / block == 5.0  # Q4_1: 5 bits per weight


def test_weights_are_the_tensor_data_in_the_file(bundled: GgufModel) -> None:
    weights = gguf_weight_bytes(bundled.tensors)
    file_size = default_chat_model().stat().st_size
    assert weights.total == 96_576_768
    assert 0 < file_size - weights.total < 2_000_000  # the rest is the header and tokenizer
    assert weights.format_name == "gguf (Q4_1)"


def test_a_truncated_gguf_is_one_clear_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(default_chat_model().read_bytes()[:4096])
    with pytest.raises(PlanError, match="is not a readable GGUF file"):
        load_model(str(broken))
