"""LoRA adapters in the engine: PEFT's own tokens, mixed batches, the prefix cache kept apart
per adapter, slots loaded and freed, and adapters it cannot serve refused with the reason.

Adapters are written by PEFT here (tests/lora_adapters.py), random in both halves. The
reference is HF transformers + PEFT on the same float32 weights.
"""

from __future__ import annotations

import json
import random
import shutil

import pytest
import torch
from engine_helpers import absorb, add, generate, greedy, run_to_end

from hf_reference import hf_greedy
from inhouse.engine.config import EngineConfig
from inhouse.engine.engine import LLMEngine
from inhouse.engine.errors import AdapterError, EngineInputError
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


@pytest.fixture(scope="session")
def bundled_adapters(bundled_model_q4, tmp_path_factory) -> dict[str, str]:
    """The three adapters for the bundled model's shapes, written by PEFT on a random HF
    model of its config (only the shapes matter to an adapter)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(bundled_model_q4.hf_folder)
    base = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return _adapters(base, tmp_path_factory.mktemp("bundled-adapters"))


def _chat_prompts(loaded, count: int) -> list[list[int]]:
    from inhouse.eval.items import load_eval_set, starter_set

    tok = loaded.tokenizer
    items = [item for item in load_eval_set(starter_set()) if item.messages][:count]
    texts = [
        tok.apply_chat_template(i.messages, add_generation_prompt=True, tokenize=False)
        for i in items
    ]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


@pytest.mark.slow
def test_three_adapters_and_the_base_in_one_batch_give_each_request_its_tokens_alone(
    bundled_model_q4, bundled_adapters
):
    """On the default path (q4 kernels): every row's logprobs, not just its tokens, are the
    ones it gets alone, whatever adapters share its steps."""
    prompts = _chat_prompts(bundled_model_q4, 4)
    names = [None, *bundled_adapters]
    engine = _engine(None, bundled_adapters, loaded=bundled_model_q4, kv_cache_memory=2**26)
    params = greedy(NEW_TOKENS, logprobs=0)
    for name in names:
        for i, prompt in enumerate(prompts):
            add(engine, f"{name}-{i}", prompt, params, adapter=name)
    together = run_to_end(engine)
    assert engine.stats().num_steps == NEW_TOKENS  # all 16 prefilled in one step
    for name in names:
        for i, prompt in enumerate(prompts):
            alone = generate(engine, {"alone": prompt}, params, adapter=name)["alone"]
            mixed = together[f"{name}-{i}"].choices[0]
            assert mixed.token_ids == alone.choices[0].token_ids, (name, i)
            assert mixed.logprobs == alone.choices[0].logprobs, (name, i)
    outputs = {
        name: [together[f"{name}-{i}"].choices[0].token_ids for i in range(4)] for name in names
    }
    assert len({str(v) for v in outputs.values()}) == len(names), "each adapter answers its own way"


def test_an_adapters_cached_blocks_answer_only_its_own_prompts(tiny_llama_folder, tmp_path):
    adapters = _adapters(_hf(tiny_llama_folder), tmp_path, names=("support", "code"))
    engine = _engine(str(tiny_llama_folder), adapters, block_size=4)
    prompt = list(range(10, 50))
    cached = {}
    for turn, name in enumerate(["support", "code", None, "support", "code", None]):
        result = generate(engine, {f"t{turn}": prompt}, greedy(4), adapter=name)[f"t{turn}"]
        cached[turn] = result.num_cached_tokens
    assert [cached[t] for t in range(3)] == [0, 0, 0]  # nobody answers another's prompt
    assert [cached[t] for t in range(3, 6)] == [36, 36, 36]  # each its own, every full block


def test_an_unloaded_adapter_finishes_its_running_requests_and_frees_its_slot_after(
    tiny_llama_folder, tmp_path
):
    adapters = _adapters(_hf(tiny_llama_folder), tmp_path, names=("support", "code"))
    prompt = [5, 9, 77, 120, 33]
    expected = {}
    for name, path in adapters.items():
        fresh = _engine(str(tiny_llama_folder), {name: path})
        expected[name] = generate(fresh, {"r": prompt}, greedy(24), adapter=name)["r"]
    engine = _engine(str(tiny_llama_folder), {"support": adapters["support"]}, max_loras=1)
    add(engine, "running", prompt, greedy(24), adapter="support")
    results = {}
    for _ in range(5):
        for out in engine.step():
            absorb(results, out)
    engine.core.unload_adapter("support")
    with pytest.raises(EngineInputError, match="no LoRA adapter named 'support'"):
        add(engine, "late", prompt, greedy(4), adapter="support")
    code = engine.core.read_adapter(adapters["code"])
    with pytest.raises(AdapterError, match="all 1 adapter slots are in use"):
        engine.core.load_adapter("code", code)  # the running request still holds the slot
    run_to_end(engine, results)
    assert results["running"].choices[0].token_ids == expected["support"].choices[0].token_ids
    engine.core.load_adapter("code", code)
    after = generate(engine, {"r2": prompt}, greedy(24), adapter="code")["r2"]
    assert after.choices[0].token_ids == expected["code"].choices[0].token_ids
    with pytest.raises(AdapterError, match="already loaded"):
        engine.core.load_adapter("code", code)
    with pytest.raises(KeyError):
        engine.core.unload_adapter("support")


def _broken(folder, tmp_path, change) -> str:
    """A copy of the adapter at ``folder`` with ``change(config, tensors)`` applied."""
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "broken"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "adapter_config.json").read_text())
    tensors = load_file(copy / "adapter_model.safetensors")
    change(config, tensors)
    (copy / "adapter_config.json").write_text(json.dumps(config))
    save_file(tensors, copy / "adapter_model.safetensors")
    return str(copy)


def _rank_32(config, tensors):
    for key in list(tensors):
        tensors[key] = torch.cat([tensors[key]] * 4, dim=0 if "lora_A" in key else 1)


def _embedding(config, tensors):
    tensors["base_model.model.model.embed_tokens.lora_A.weight"] = torch.zeros(8, 384)


def _no_weights(config, tensors):
    tensors.clear()
    tensors["unrelated"] = torch.zeros(1)


def _short_b(config, tensors):
    key = next(k for k in tensors if "q_proj.lora_B" in k)
    tensors[key] = tensors[key][:-1]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_rank_32, "rank 32 is above --max-lora-rank 16"),
        (lambda c, t: c.update(use_dora=True), "use_dora not supported"),
        (lambda c, t: c.update(modules_to_save=["lm_head"]), "modules_to_save not supported"),
        (lambda c, t: c.update(peft_type="IA3"), "only LORA is served"),
        (_embedding, "is not a LoRA pair of a projection"),
        (_no_weights, "is not a LoRA pair of a projection"),
        (_short_b, "do not fit the base's"),
    ],
)
def test_an_adapter_the_engine_cannot_serve_is_refused_with_the_reason(
    change, message, tiny_llama_folder, tmp_path
):
    adapters = _adapters(_hf(tiny_llama_folder), tmp_path, names=("support",))
    engine = _engine(str(tiny_llama_folder), adapters)
    with pytest.raises(AdapterError, match=message):
        engine.core.read_adapter(_broken(adapters["support"], tmp_path, change))
    with pytest.raises(AdapterError, match="is not a PEFT LoRA adapter"):
        engine.core.read_adapter(str(tmp_path))
    generate(engine, {"still": [5, 6, 7]}, greedy(4), adapter="support")  # nothing harmed


def test_an_adapter_of_another_base_is_refused(tiny_llama_folder, tiny_qwen3_folder, tmp_path):
    other = _adapters(_hf(tiny_qwen3_folder), tmp_path, names=("support",))
    with pytest.raises(AdapterError, match="do not fit the base's"):
        _engine(str(tiny_llama_folder), other)


def test_the_slots_are_counted_in_the_default_kv_budget(tiny_llama_folder, tmp_path):
    adapters = _adapters(_hf(tiny_llama_folder), tmp_path, names=("support",))
    engine = _engine(str(tiny_llama_folder), adapters, kv_cache_memory=None, max_lora_rank=8)
    # 4 slots (the default), 3 layers: qkv 64 -> 128 (3 parts), o 64 -> 64, gate_up 64 -> 192
    # (2 parts), down 96 -> 64, float32: A [in, parts * 8], B in blocks of 16 outputs holding
    # their own part's 8 rank rows (every part starts on a block), a scale per out; int64
    # layout entries, 2 + one per block
    per_layer = (64 * 24 + 8 * 128 + 128) + (64 * 8 + 8 * 64 + 64)
    per_layer += (64 * 16 + 8 * 192 + 192) + (96 * 8 + 8 * 64 + 64)
    layout = (2 + 128 // 16) + (2 + 64 // 16) + (2 + 192 // 16) + (2 + 64 // 16)
    expected = 4 * 3 * (per_layer * 4 + layout * 8)
    budget = engine.info.budget
    assert budget.adapter_bytes == engine.core.adapters.num_bytes == expected
    assert f"less {expected / 2**20:.1f} MiB of LoRA adapter slots" in budget.reason
