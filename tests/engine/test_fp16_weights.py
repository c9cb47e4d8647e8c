"""fp16 weights (fbgemm's packed float16, float32 products): the CPU default without C++ kernels.

The independent reference is HF transformers on the same weights rounded to float16
and run in float32 (our embedding lookup reads the float32 checkpoint where it can, so
the two differ a little more than summation order). Near-ties may break either way:
every token our greedy decode picks must be HF's top choice up to ``TOLERANCE`` in
logits, and HF's argmax in at least 95% of the steps.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch
from test_model_equality import runner_greedy

from inhouse.engine.models.loader import load_model
from inhouse.engine.runner import ModelRunner

TOLERANCE = 0.02


def hf_with_fp16_weights(folder):
    """HF's model with every projection and the embedding rounded to float16, in float32."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "norm" not in name:
                param.copy_(param.half().float())
    return hf


@torch.inference_mode()
def assert_greedy_consistent(
    hf,
    prompts: list[list[int]],
    ours: list[list[int]],
    tolerance: float = TOLERANCE,
    exact_share: float = 0.95,
    before: Callable[[list[int]], None] | None = None,
) -> None:
    """Each token we picked within ``tolerance`` of HF's best logit, most of them HF's best
    (``before`` is told each prompt before HF runs it)."""
    exact = total = 0
    for prompt, got in zip(prompts, ours, strict=True):
        if before is not None:
            before(prompt)
        logits = hf(input_ids=torch.tensor([prompt + got])).logits[0]
        steps = logits[len(prompt) - 1 : len(prompt) - 1 + len(got)]
        chosen = steps[torch.arange(len(got)), torch.tensor(got)]
        gap = steps.max(-1).values - chosen
        assert float(gap.max()) <= tolerance, (
            f"picked a token {float(gap.max()):.4f} below the best"
        )
        exact += int((gap == 0).sum())
        total += len(got)
    assert exact >= exact_share * total


@pytest.mark.parametrize("folder_fixture", ["tiny_qwen2_folder", "tiny_qwen3_folder"])
def test_tiny_models_with_fp16_weights_agree_with_hf(folder_fixture, request) -> None:
    folder = request.getfixturevalue(folder_fixture)
    loaded = load_model(folder, dtype="float32", quantization="fp16")
    assert loaded.quantization == "fp16"
    runner = ModelRunner(loaded, num_blocks=64, block_size=4)
    rng = random.Random(11)
    prompts = [[rng.randrange(3, 384) for _ in range(n)] for n in (5, 12, 29)]
    ours = runner_greedy(runner, prompts, new_tokens=32)
    assert_greedy_consistent(hf_with_fp16_weights(folder), prompts, ours)


def chat_prompt_ids(
    tok,
    questions: tuple[str, ...] = ("What is the capital of France?", "Explain why the sky is blue."),
) -> list[list[int]]:
    """Short questions (by default two) in the tokenizer's chat template, as token ids."""
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in questions
    ]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


@pytest.mark.slow
def test_bundled_model_with_fp16_weights_agrees_with_hf(
    bundled_model_fp16, bundled_model_fp32
) -> None:
    loaded = bundled_model_fp16
    prompts = chat_prompt_ids(loaded.tokenizer)
    ours = runner_greedy(ModelRunner(loaded, num_blocks=64, block_size=16), prompts, 64)
    hf = hf_with_fp16_weights(loaded.hf_folder)
    assert_greedy_consistent(hf, prompts, ours)
    exact = runner_greedy(
        ModelRunner(bundled_model_fp32, num_blocks=64, block_size=16), prompts, 64
    )
    assert ours[0][:16] == exact[0][:16], "fp16 weights should not change an easy answer"


def test_packing_keeps_no_float32_copy_of_the_projections(tiny_qwen3_folder) -> None:
    loaded = load_model(tiny_qwen3_folder, dtype="float32", quantization="fp16")
    model = loaded.model
    assert model.layers[0].mlp.gate_up_proj.weight is None
    assert model.lm_head.weight is None and model.lm_head.packed is not None
    # only looked up: a float32 view of the checkpoint file, resident where tokens read it
    assert model.embed_tokens.weight.dtype == torch.float32
    assert not model.embed_tokens.weight.untyped_storage().resizable()
    assert model.norm.weight.dtype == torch.float32
