"""Shared engine fixtures: tiny random HF model folders and the bundled SmolLM2, loaded once.

The tiny folders are real HF checkpoints written by transformers ``save_pretrained`` (with
a small byte-level BPE tokenizer trained here), so the loader reads them exactly as it
reads a downloaded model. Their weights, biases and norm scales are all random and
larger than HF's default init, so every parameter matters and greedy argmaxes are not
near-ties.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tiny_models import TINY_COMMON as _COMMON
from tiny_models import save_tiny as _save_tiny


@pytest.fixture(scope="session")
def tiny_llama_folder(tmp_path_factory) -> Path:
    """Llama-style: untied lm_head, no biases."""
    from transformers import LlamaConfig

    config = LlamaConfig(**_COMMON, rope_theta=10000.0, tie_word_embeddings=False)
    return _save_tiny(tmp_path_factory.mktemp("tiny-llama"), config, seed=1)


@pytest.fixture(scope="session")
def tiny_qwen2_folder(tmp_path_factory) -> Path:
    """Qwen2-style: q/k/v carry a bias, tied embeddings."""
    from transformers import Qwen2Config

    config = Qwen2Config(**_COMMON, rope_theta=1000000.0, tie_word_embeddings=True)
    return _save_tiny(tmp_path_factory.mktemp("tiny-qwen2"), config, seed=2)


@pytest.fixture(scope="session")
def tiny_qwen3_folder(tmp_path_factory) -> Path:
    """Qwen3-style: per-head q/k RMSNorm, head_dim 32 while hidden/heads is 16."""
    from transformers import Qwen3Config

    config = Qwen3Config(**_COMMON, head_dim=32, rope_theta=1000000.0, tie_word_embeddings=False)
    return _save_tiny(tmp_path_factory.mktemp("tiny-qwen3"), config, seed=3)


@pytest.fixture(scope="session")
def tiny_mistral_folder(tmp_path_factory) -> Path:
    """Mistral-style: every layer attends over a sliding window of 8 positions."""
    from transformers import MistralConfig

    config = MistralConfig(**_COMMON, sliding_window=8, tie_word_embeddings=False)
    return _save_tiny(tmp_path_factory.mktemp("tiny-mistral"), config, seed=4)


@pytest.fixture(scope="session")
def tiny_qwen2_window_folder(tmp_path_factory) -> Path:
    """Qwen2 with use_sliding_window: layers from max_window_layers on slide over 6."""
    from transformers import Qwen2Config

    config = Qwen2Config(**_COMMON, use_sliding_window=True, sliding_window=6, max_window_layers=1)
    return _save_tiny(tmp_path_factory.mktemp("tiny-qwen2-window"), config, seed=5)


@pytest.fixture(scope="session")
def bundled_model_fp32():
    """The bundled SmolLM2 GGUF loaded in float32 (converted once into the inhouse cache)."""
    from inhouse.engine.models.loader import load_model

    return load_model(None, dtype="float32")


@pytest.fixture(scope="session")
def bundled_model_fp16():
    """The bundled SmolLM2 with fp16 weights packed for fbgemm and float32 activations.

    The dtype is named: on a CPU with bf16 "auto" means bfloat16, which fbgemm's fp16
    weights cannot multiply, yet this path runs on every x86 CPU and is checked on each.
    """
    from inhouse.engine.models.loader import load_model

    return load_model(None, dtype="float32", quantization="fp16")


@pytest.fixture(scope="session")
def bundled_model_q8():
    """The bundled SmolLM2 with int8 block weights for the C++ kernels: the CPU default
    for every source but a Q4_1 GGUF wherever they build (float32 activations)."""
    from inhouse.engine.models.loader import load_model

    return load_model(None, quantization="q8")


@pytest.fixture(scope="session")
def bundled_model_q4():
    """The bundled SmolLM2 with 4-bit block weights (the GGUF's own Q4_1 blocks) for the
    C++ kernels, float32 activations: its default wherever they build."""
    from inhouse.engine.models.loader import load_model

    return load_model(None, quantization="q4")


@pytest.fixture(scope="session")
def bundled_model_bf16():
    """The bundled SmolLM2 in bfloat16: asked for, or the default on CPUs with avx512_bf16
    or AMX where the C++ kernels cannot be built.

    It runs everywhere (torch emulates bf16 products where the CPU lacks them, slowly).
    """
    from inhouse.engine.models.loader import load_model

    return load_model(None, dtype="bfloat16")


@pytest.fixture(scope="session")
def bundled_model(request):
    """The bundled SmolLM2 GGUF with the default dtype, as the engine loads it.

    Where "auto" means float32 (a CPU without bf16) this is the float32 fixture itself.
    """
    from inhouse.engine.models.loader import load_model
    from inhouse.engine.models.precision import resolve_dtype

    if resolve_dtype("auto", torch.device("cpu")) == torch.float32:
        return request.getfixturevalue("bundled_model_fp32")
    return load_model(None)


@pytest.fixture(scope="session")
def hf_bundled_fp32(bundled_model_fp32):
    """HF transformers' own model of the bundled GGUF (it dequantizes the file itself), the
    independent reference for the bundled model's tokens."""
    from transformers import AutoModelForCausalLM

    path = bundled_model_fp32.source_path
    return AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
