"""``--kv-cache-dtype int8``: each token's K and V of each KV head kept as 64 int8 codes and
a float scale, written and read by the C++ kernels (its bits per request independent of the
batch: the sixteen-request check in ``test_engine_smollm2.py`` runs it too), refused with a
clear sentence off their path, sized by the budget with its scales counted, and close to the
float16 cache's greedy tokens on the bundled model (its eval-set accuracy: docs/serve.md)."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import generate, needs_kernels

from inhouse.engine.config import EngineConfig
from inhouse.engine.engine import LLMEngine
from inhouse.engine.errors import EngineConfigError
from inhouse.engine.models.loader import ModelSourceError, load_model
from inhouse.engine.sampling_params import SamplingParams

pytestmark = needs_kernels


def engine_of(loaded, **config) -> LLMEngine:
    settings = {"max_model_len": 2048, "kv_cache_memory": 64 * 2**20, **config}
    return LLMEngine(EngineConfig(**settings), loaded=loaded)


def test_an_int8_cache_is_refused_off_the_kernels_path(tiny_llama_folder, tiny_qwen3_folder):
    with pytest.raises(EngineConfigError, match="unknown kv_cache_dtype 'fp9'; use auto, int8"):
        EngineConfig(kv_cache_dtype="fp9")
    plain = load_model(tiny_llama_folder, quantization="none")
    with pytest.raises(ModelSourceError, match="q8/q4 weights; this model runs none weights"):
        engine_of(plain, max_model_len=128, kv_cache_dtype="int8")
    qwen3 = load_model(tiny_qwen3_folder, quantization="q8")
    with pytest.raises(ModelSourceError, match="per-head q/k norms"):
        engine_of(qwen3, max_model_len=128, kv_cache_dtype="int8")
    assert engine_of(qwen3, max_model_len=128).core.runner.kv_cache.dtype == torch.float16


def test_an_int8_cache_holds_its_rows_and_scales_in_the_budget(bundled_model_q4):
    half = engine_of(bundled_model_q4)
    int8 = engine_of(bundled_model_q4, kv_cache_dtype="int8")
    cache = int8.core.runner.kv_cache
    assert cache.dtype == torch.int8 and cache.shape[-1] == 64 + 4
    assert int8.info.kv_cache_dtype == "int8" and half.info.kv_cache_dtype == "float16"
    per_token = int8.core.runner.kv_bytes_per_token
    assert per_token == int8.core.budget.kv_bytes_per_token == 2 * 30 * 3 * 68
    assert per_token * 128 == half.core.runner.kv_bytes_per_token * 68
    assert cache.numel() <= 64 * 2**20  # the budget, scales included
    assert int8.core.budget.num_blocks >= 1.8 * half.core.budget.num_blocks
    assert bundled_model_q4.kv_cache_dtype == "auto"  # the caller's model is left as it was


def test_greedy_tokens_stay_close_to_the_float16_caches(bundled_model_q4):
    """Seven chat prompts and one of ~1,200 tokens, 24 greedy tokens each: at least half the
    completions equal the float16 cache's word for word and every one starts with its first
    token (measured on the AVX2 host: 4 of 8 equal; the others part after 23, 6, 6 and 1
    tokens, at the near-ties of a 135M model's 4-bit weights)."""
    tok = bundled_model_q4.tokenizer
    questions = [
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "List five fruits.",
        "Why is the sky blue?",
        "Write a Python function that adds two numbers.",
        "How many legs does a spider have?",
        "Translate 'good morning' into French.",
        "Summarize in one sentence: " + " ".join(["The council met to plan the budget."] * 150),
    ]
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in questions
    ]
    prompts = {
        f"q{i}": tok(text, add_special_tokens=False)["input_ids"] for i, text in enumerate(texts)
    }
    assert max(len(p) for p in prompts.values()) > 1200
    params = SamplingParams(temperature=0, max_tokens=24)
    outputs = {}
    for kv in ("auto", "int8"):
        done = generate(engine_of(bundled_model_q4, kv_cache_dtype=kv), prompts, params)
        outputs[kv] = {rid: out.choices[0].token_ids for rid, out in done.items()}
    same = [rid for rid in prompts if outputs["int8"][rid] == outputs["auto"][rid]]
    assert len(same) >= len(prompts) // 2, (same, outputs)
    assert all(outputs["int8"][rid][0] == outputs["auto"][rid][0] for rid in prompts)
