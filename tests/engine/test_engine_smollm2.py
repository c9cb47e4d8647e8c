"""The whole engine path on the bundled SmolLM2 in float32: equal to HF ``generate`` token
for token (EOS and stop strings included), and batch-invariant across 16 requests (also
with fp16 weights, the CPU default: neither MKL's nor fbgemm's GEMMs give bitwise the
same rows for every batch size, so this checks the greedy tokens hold anyway)."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import add, generate, run_to_end

from inhouse.engine.config import EngineConfig
from inhouse.engine.engine import LLMEngine
from inhouse.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "What is 2 + 2? Answer with a number only.",
]
MORE = [
    "Name a primary colour.",
    "Explain in detail how a bicycle works, covering the frame, the wheels, the chain and "
    "the brakes, and why it stays upright when moving.",
    "Hi",
    "List five fruits.",
    "Translate 'good morning' into French.",
    "Why is the sky blue?",
    "Write a Python function that adds two numbers.",
    "What does CPU stand for?",
    "Give me a synonym for happy.",
    "How many legs does a spider have?",
    "Summarize the plot of Romeo and Juliet in one sentence, mentioning both families.",
    "What is the boiling point of water in Celsius?",
    "Say something nice.",
]


@pytest.fixture(scope="module")
def chat_prompts(bundled_model_fp32) -> list[list[int]]:
    tok = bundled_model_fp32.tokenizer
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in QUESTIONS + MORE
    ]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def smol_engine(loaded, **config) -> LLMEngine:
    settings = {"max_model_len": 1024, "kv_cache_memory": 64 * 2**20, "seed": 0, **config}
    return LLMEngine(EngineConfig(**settings), loaded=loaded)


@torch.inference_mode()
def hf_generate(hf, prompt: list[int], max_new: int, eos: list[int]) -> list[int]:
    out = hf.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        do_sample=False,
        max_new_tokens=max_new,
        eos_token_id=eos,
        pad_token_id=eos[0],
    )
    return out[0, len(prompt) :].tolist()


def test_engine_greedy_equals_hf_generate_with_eos_and_stop(bundled_model_fp32, chat_prompts):
    from transformers import AutoModelForCausalLM

    loaded = bundled_model_fp32
    hf = AutoModelForCausalLM.from_pretrained(loaded.hf_folder, dtype=torch.float32).eval()
    eos = sorted(loaded.eos_token_ids)
    prompts = chat_prompts[: len(QUESTIONS)]
    engine = smol_engine(loaded)
    params = SamplingParams(temperature=0, max_tokens=64)
    ours = generate(engine, {f"q{i}": p for i, p in enumerate(prompts)}, params)
    stopped_on_eos = 0
    for i, prompt in enumerate(prompts):
        expected = hf_generate(hf, prompt, 64, eos)
        choice = ours[f"q{i}"].choices[0]
        assert choice.token_ids == expected, QUESTIONS[i]
        assert choice.text == loaded.tokenizer.decode(expected, skip_special_tokens=True)
        if expected[-1] in eos:
            stopped_on_eos += 1
            assert choice.finish_reason == "stop" and choice.stop_reason is None
        else:
            assert len(expected) == 64 and choice.finish_reason == "length"
    assert stopped_on_eos >= 2

    long_text = ours["q1"].choices[0].text
    stop = long_text.split()[3]
    params = SamplingParams(temperature=0, max_tokens=24, stop=[stop])
    stopped = generate(engine, {"s": prompts[1]}, params)
    choice = stopped["s"].choices[0]
    assert choice.text == long_text[: long_text.index(stop)]
    assert (choice.finish_reason, choice.stop_reason) == ("stop", stop)


def _bf16_path_id() -> str:
    from inhouse.engine.models.precision import resolve_dtype

    auto = resolve_dtype("auto", torch.device("cpu"))
    return "bf16-native" if auto == torch.bfloat16 else "bf16-emulated"


@pytest.mark.parametrize(
    ("weights", "kv_cache_dtype"),
    [
        pytest.param("bundled_model_fp32", "auto", id="fp32"),
        pytest.param("bundled_model_fp16", "auto", id="fp16-weights"),
        pytest.param("bundled_model_bf16", "auto", id=_bf16_path_id()),
        pytest.param("bundled_model_q8", "auto", id="q8-kernels"),
        pytest.param("bundled_model_q4", "auto", id="q4-kernels"),
        pytest.param("bundled_model_q4", "int8", id="q4-kernels-int8-kv"),
    ],
)
def test_sixteen_requests_together_equal_each_alone(weights, kv_cache_dtype, chat_prompts, request):
    loaded = request.getfixturevalue(weights)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = {f"r{i}": p for i, p in enumerate(chat_prompts)}
    assert len(prompts) == 16 and len({len(p) for p in prompts.values()}) > 8
    engine = smol_engine(loaded, enable_prefix_caching=False, kv_cache_dtype=kv_cache_dtype)
    alone = {
        rid: generate(engine, {rid: p}, params)[rid].choices[0].token_ids
        for rid, p in prompts.items()
    }
    engine = smol_engine(loaded, max_num_batched_tokens=64, kv_cache_dtype=kv_cache_dtype)
    for rid, p in prompts.items():
        add(engine, rid, p, params)
    together = run_to_end(engine)
    assert {rid: r.choices[0].token_ids for rid, r in together.items()} == alone
    assert engine.stats().prefix_cache_hits > 0  # the chat template's system prompt is shared
    for policy in ("priority", "fair"):  # three classes, two tenants, a shared prefill cap
        engine = smol_engine(
            loaded,
            max_num_batched_tokens=64,
            scheduling_policy=policy,
            long_prefill_token_threshold=24,
            kv_cache_dtype=kv_cache_dtype,
        )
        for k, (rid, p) in enumerate(prompts.items()):
            add(engine, rid, p, params, priority=k % 3 - 1, cache_salt=f"tenant{k % 2}")
        together = run_to_end(engine)
        assert {rid: r.choices[0].token_ids for rid, r in together.items()} == alone, policy
