"""``--kv-cache-dtype int8``: each token's K and V of each KV head kept as 64 int8 codes and
a float scale, written and read by the C++ kernels (its bits per request independent of the
batch: the sixteen-request check in ``test_engine_smollm2.py`` runs it too), refused with a
clear sentence off their path, and sized by the budget with its scales counted. Its attention
is checked against a reference of its own in ``test_int8_kv_attention.py``; how often its greedy
tokens equal the float16 cache's is a measured statement in docs/serve.md, not an assertion:
a 135M model's near-ties decide it, and they move with the host's float kernels."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import needs_kernels

from inhouse.engine.config import EngineConfig
from inhouse.engine.engine import LLMEngine
from inhouse.engine.errors import EngineConfigError
from inhouse.engine.models.loader import ModelSourceError, load_model

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
