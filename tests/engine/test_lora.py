"""LoRA adapters in the engine: PEFT's own tokens, mixed batches, the prefix cache kept apart
per adapter, slots loaded and freed, and adapters it cannot serve refused with the reason.

Adapters are written by PEFT here (tests/lora_adapters.py), random in both halves. The
reference is HF transformers + PEFT on the same float32 weights.
"""

from __future__ import annotations

import random

import pytest
import torch
from engine_helpers import generate, greedy

from hf_reference import hf_greedy
from inhouse.engine.config import EngineConfig
from inhouse.engine.engine import LLMEngine
from lora_adapters import peft_greedy, save_random_adapter

NEW_TOKENS = 16
# (rank, alpha, targets, rsLoRA): every projection; attention only; the MLP only, rsLoRA
ADAPTERS = {
    "support": (
        8,
        16,
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        False,
    ),
    "code": (4, 32, ("q_proj", "v_proj", "o_proj"), False),
    "legal": (16, 8, ("gate_proj", "up_proj", "down_proj"), True),
}


def _hf(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _adapters(base, root, names=tuple(ADAPTERS)) -> dict[str, str]:
    saved = {}
    for seed, name in enumerate(names):
        rank, alpha, targets, rslora = ADAPTERS[name]
        folder = root / name
        save_random_adapter(
            base, folder, seed=seed + 1, rank=rank, alpha=alpha, targets=targets, rslora=rslora
        )
        saved[name] = str(folder)
    return saved


def _engine(model, adapters: dict[str, str], loaded=None, **config) -> LLMEngine:
    settings = {"dtype": "float32", "max_model_len": 256, "kv_cache_memory": 2**24, "seed": 0}
    return LLMEngine(
        EngineConfig(model=model, lora_modules=adapters, **{**settings, **config}), loaded=loaded
    )


def _tokens(engine: LLMEngine, prompts: list[list[int]], adapter: str | None) -> list[list[int]]:
    ids = {f"{adapter}-{i}": p for i, p in enumerate(prompts)}
    results = generate(engine, ids, greedy(NEW_TOKENS), adapter=adapter)
    return [results[k].choices[0].token_ids for k in ids]


@pytest.mark.parametrize("folder_fixture", ["tiny_llama_folder", "tiny_qwen2_folder"])
def test_greedy_tokens_with_each_adapter_equal_peft(folder_fixture, request, tmp_path):
    folder = request.getfixturevalue(folder_fixture)
    base = _hf(folder)
    adapters = _adapters(base, tmp_path)
    rng = random.Random(11)
    prompts = [[rng.randrange(3, 384) for _ in range(rng.randrange(3, 40))] for _ in range(20)]
    engine = _engine(str(folder), adapters, quantization="none")
    plain = _tokens(engine, prompts, None)
    assert plain == [hf_greedy(base, p, NEW_TOKENS) for p in prompts]
    for name, path in adapters.items():
        ours = _tokens(engine, prompts, name)
        assert ours == peft_greedy(base, path, prompts, NEW_TOKENS), name
        assert sum(o != p for o, p in zip(ours, plain, strict=True)) >= 15, f"{name} changes little"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_bundled_model_with_an_adapter_equals_peft_on_twenty_held_out_prompts(
    bundled_model_fp32, hf_bundled_fp32, tmp_path
):
    from inhouse.eval.items import load_eval_set, starter_set

    path = save_random_adapter(hf_bundled_fp32, tmp_path / "support", seed=5, rank=8, size=0.2)
    tok = bundled_model_fp32.tokenizer
    items = [item for item in load_eval_set(starter_set()) if item.messages][::2][:20]
    assert len(items) == 20
    texts = [
        tok.apply_chat_template(i.messages, add_generation_prompt=True, tokenize=False)
        for i in items
    ]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    engine = _engine(
        None,
        {"support": str(path)},
        loaded=bundled_model_fp32,
        max_model_len=512,
        kv_cache_memory=2**26,
    )
    ours = _tokens(engine, prompts, "support")
    assert ours == peft_greedy(hf_bundled_fp32, path, prompts, NEW_TOKENS)
    assert ours != _tokens(engine, prompts, None)
