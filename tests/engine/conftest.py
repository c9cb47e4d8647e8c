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

TINY_VOCAB = 384
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention keeps the KV cache in fixed-size blocks.",
    "def add(a, b):\n    return a + b\n",
    "Continuous batching admits new requests at every step.",
    "Überprüfung: naïve café, 東京, emoji 🙂.",
] * 4


def _tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
        pad_token=specials[0],
    )
    fast.chat_template = TINY_CHAT_TEMPLATE
    return fast


def _randomize(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))


def _save_tiny(folder: Path, config, seed: int) -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomize(model, seed)
    model.save_pretrained(folder)
    _tiny_tokenizer().save_pretrained(folder)
    return folder


_COMMON = dict(
    vocab_size=TINY_VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    eos_token_id=2,
    bos_token_id=1,
)


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
