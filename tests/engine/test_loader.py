"""Loader: sources, GGUF conversion cache, tokenizer and chat template, dtype choice, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inhouse.engine.models.gguf_convert import (
    GGUFConversionError,
    hf_tensor_name,
    unpermute_rotary_rows,
)
from inhouse.engine.models.llama import LlamaArgs
from inhouse.engine.models.loader import (
    ModelSourceError,
    _cached_gguf,
    default_cache_dir,
    load_model,
)
from inhouse.engine.models.precision import resolve_dtype
from inhouse.manifests.hashing import file_sha256


def _llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's LlamaModel.permute, as published."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


@pytest.mark.parametrize("heads", [1, 3, 9])
def test_unpermute_inverts_llama_cpp_permutation(heads):
    w = np.random.default_rng(0).standard_normal((heads * 64, 40)).astype(np.float32)
    permuted = _llama_cpp_permute(w, heads)
    assert not np.array_equal(permuted, w)
    np.testing.assert_array_equal(unpermute_rotary_rows(permuted, heads), w)


def test_gguf_tensor_names_map_to_hf():
    assert hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_tensor_name("blk.12.attn_q.bias") == "model.layers.12.self_attn.q_proj.bias"
    assert (
        hf_tensor_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    )
    assert hf_tensor_name("output.weight") == "lm_head.weight"
    with pytest.raises(GGUFConversionError, match="unknown GGUF tensor"):
        hf_tensor_name("blk.0.ssm_conv1d.weight")


def test_bundled_model_metadata(bundled_model):
    loaded = bundled_model
    assert loaded.model_id == "SmolLM2-135M-Instruct"
    assert loaded.source_sha256 == file_sha256(loaded.source_path)
    assert loaded.hf_folder == default_cache_dir() / "gguf" / loaded.source_sha256
    assert loaded.config_dict["model_type"] == "llama"
    assert loaded.hf_config.num_hidden_layers == 30
    assert loaded.eos_token_ids == {2}
    assert loaded.tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"
    text = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert "<|im_start|>user\nHi<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert loaded.chat_template == loaded.tokenizer.chat_template


def test_tied_embeddings_share_one_tensor(bundled_model):
    model = bundled_model.model
    assert model.args.tie_word_embeddings
    assert model.lm_head.weight is model.embed_tokens.weight


def test_gguf_conversion_is_cached_by_sha256(bundled_model):
    folder = bundled_model.hf_folder
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    again, sha = _cached_gguf(bundled_model.source_path, default_cache_dir())
    assert (again, sha) == (folder, bundled_model.source_sha256)
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert {"config.json", "tokenizer.json"} <= {p.name for p in folder.iterdir()}


def test_hf_folder_variants_read_from_config(tiny_qwen2_folder, tiny_qwen3_folder):
    qwen2 = load_model(tiny_qwen2_folder, dtype="float32")
    assert qwen2.model.args.qkv_bias and not qwen2.model.args.o_bias
    assert qwen2.model.lm_head.weight is qwen2.model.embed_tokens.weight
    assert qwen2.model_id == tiny_qwen2_folder.name
    qwen3 = load_model(tiny_qwen3_folder, dtype="bfloat16")
    assert qwen3.model.args.qk_norm and qwen3.model.args.head_dim == 32
    assert qwen3.model.embed_tokens.weight.dtype == torch.bfloat16
    assert qwen3.chat_template and "<|im_start|>" in qwen3.chat_template


def test_dtype_names():
    cpu = torch.device("cpu")
    assert resolve_dtype("float32", cpu) == torch.float32
    assert resolve_dtype("bf16", cpu) == torch.bfloat16
    assert resolve_dtype("auto", cpu) in (torch.float32, torch.bfloat16)
    with pytest.raises(ValueError, match="unknown dtype 'int4'"):
        resolve_dtype("int4", cpu)


def test_bad_sources_are_refused_clearly(tmp_path):
    with pytest.raises(ModelSourceError, match=r"neither a \.gguf file nor a folder"):
        load_model(tmp_path / "missing")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelSourceError, match=r"no \*\.safetensors"):
        load_model(tmp_path)


def test_pickle_weights_are_refused_with_the_reason(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")  # pickle of the int 1
    with pytest.raises(ModelSourceError, match=r"pytorch_model\.bin.*unpickling runs arbitrary"):
        load_model(tmp_path)
    with pytest.raises(ModelSourceError, match=r"pytorch_model\.bin.*refused"):
        load_model(tmp_path / "pytorch_model.bin")


def test_unsupported_architecture_is_refused():
    from transformers import GPT2Config

    with pytest.raises(ValueError, match="architecture 'GPT2LMHeadModel' is not supported"):
        LlamaArgs.from_hf_config(GPT2Config(architectures=["GPT2LMHeadModel"]))
