"""Greedy tokens of our model path equal HF transformers' on the same weights, token for token.

Our side runs the ModelRunner with hand-made, shuffled block tables: all sequences prefill
together in one batched step, then decode together. HF's side is its own forward with its
own KV cache, one sequence at a time. For the bundled SmolLM2, HF dequantizes the GGUF
itself, so a wrong q/k un-permutation in our converter would show up here.
"""

from __future__ import annotations

import random

import pytest
import torch

from hf_reference import hf_greedy
from inhouse.engine.models.loader import load_model
from inhouse.engine.runner import ModelRunner
from inhouse.engine.sequence import Sequence


def runner_greedy(
    runner: ModelRunner, prompts: list[list[int]], new_tokens: int, seed: int = 0
) -> list[list[int]]:
    """Generate ``new_tokens`` greedily for all prompts at once; return the new tokens."""
    bs = runner.block_size
    free = list(range(runner.num_blocks))
    random.Random(seed).shuffle(free)
    seqs = []
    for i, prompt in enumerate(prompts):
        need = -(-(len(prompt) + new_tokens) // bs)
        seq = Sequence(f"r{i}", list(prompt), sampling_params=None)
        seq.block_table, free = free[:need], free[need:]
        seqs.append(seq)
    batch = [(s, s.num_tokens) for s in seqs]
    for _ in range(new_tokens):
        logits = runner.execute(batch)
        for (seq, n), row in zip(batch, logits, strict=True):
            seq.num_computed_tokens += n
            seq.token_ids.append(int(row.argmax()))
        batch = [(s, 1) for s in seqs]
    return [s.output_token_ids for s in seqs]


DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
    ),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "folder_fixture",
    [
        "tiny_llama_folder",
        "tiny_qwen2_folder",
        "tiny_qwen3_folder",
        "tiny_mistral_folder",
        "tiny_qwen2_window_folder",
    ],
)
def test_tiny_models_match_hf_greedy(folder_fixture, device, request):
    from transformers import AutoModelForCausalLM

    folder = request.getfixturevalue(folder_fixture)
    loaded = load_model(folder, dtype="float32", device=device)
    runner = ModelRunner(loaded, num_blocks=64, block_size=4)
    rng = random.Random(7)
    prompts = [[rng.randrange(3, 384) for _ in range(n)] for n in (3, 9, 17, 30)]
    ours = runner_greedy(runner, prompts, new_tokens=40)

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for prompt, got in zip(prompts, ours, strict=True):
        assert got == hf_greedy(hf, prompt, 40)
    assert len({tuple(t) for t in ours}) == len(ours), "distinct prompts should diverge"


@pytest.mark.slow
@pytest.mark.timeout(1500)  # HF dequantizes the GGUF in Python and decodes token by token
def test_bundled_smollm2_matches_hf_loading_the_gguf(bundled_model_fp32, hf_bundled_fp32):
    loaded, hf = bundled_model_fp32, hf_bundled_fp32
    tok = loaded.tokenizer
    questions = [
        "What is the capital of France?",
        "Write a Python function that reverses a string.",
        "Explain why the sky is blue in two sentences.",
    ]
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in questions
    ]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    runner = ModelRunner(loaded, num_blocks=128, block_size=16)
    ours = runner_greedy(runner, prompts, new_tokens=64)
    for prompt, got in zip(prompts, ours, strict=True):
        assert got == hf_greedy(hf, prompt, 64), tok.decode(prompt)
