"""A prompt's rows attended on AMX tiles and a generated token's by the float32 loops
(where the host has the tiles; elsewhere every row takes the loops and these hold
trivially): a request's bits, logprobs included, do not depend on being preempted and
recomputed, nor on the prefix cache holding an earlier turn's generated tokens."""

from __future__ import annotations

import random

import pytest
import torch
from engine_helpers import add, generate, needs_kernels, run_to_end

from inhouse.engine.config import EngineConfig
from inhouse.engine.engine import LLMEngine
from inhouse.engine.sampling_params import SamplingParams

pytestmark = [needs_kernels, pytest.mark.slow]

PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=0)


def engine_for(loaded, **config) -> LLMEngine:
    settings = {"max_model_len": 1024, "kv_cache_memory": 64 * 2**20, "seed": 0, **config}
    return LLMEngine(EngineConfig(**settings), loaded=loaded)


def prompts(count: int, length: int, seed: int) -> dict[str, list[int]]:
    rng = random.Random(seed)
    return {f"p{i}": [rng.randrange(100, 40_000) for _ in range(length)] for i in range(count)}


def bits(result) -> list[tuple[int, float]]:
    choice = result.choices[0]
    return [(t.token_id, t.logprob) for t in choice.logprobs]


def test_tiles_are_on_for_the_q4_model_where_the_host_has_them(bundled_model_q4):
    engine = engine_for(bundled_model_q4)
    expected = bool(torch.ops.inhouse_cpu.prompt_attention_tiles(64))
    assert engine.core.runner.prompt_tiles == expected
    assert engine.core.kv_cache.generated_apart == expected


def test_a_preempted_request_recomputes_its_generated_tokens_with_their_own_bits(bundled_model_q4):
    requests = prompts(4, 150, seed=1)
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True, logprobs=0)
    alone = {
        rid: bits(generate(engine_for(bundled_model_q4), {rid: p}, params)[rid])
        for rid, p in requests.items()
    }
    # 720 slots for 4 x 214 tokens, admitted without reserve: sequences are preempted while
    # they decode, and recompute their generated tokens (past their cached full blocks)
    tight = engine_for(bundled_model_q4, kv_cache_memory=2**20 * 16, kv_reserve=0.0,
                       max_model_len=512, max_num_batched_tokens=128)  # fmt: skip
    for rid, p in requests.items():
        add(tight, rid, p, params)
    together = run_to_end(tight)
    assert tight.stats().num_preemptions > 0
    assert {rid: bits(r) for rid, r in together.items()} == alone


def test_the_next_turn_has_the_same_bits_whatever_the_cache_holds(bundled_model_q4):
    (first,) = prompts(1, 200, seed=2).values()
    engine = engine_for(bundled_model_q4, max_num_batched_tokens=96)
    answer = generate(engine, {"turn1": first}, PARAMS)["turn1"].choices[0].token_ids
    follow_up = first + answer + prompts(1, 40, seed=3)["p0"]
    hits_before = engine.stats().prefix_cache_hits
    warm = generate(engine, {"turn2": follow_up}, PARAMS)["turn2"]
    assert engine.stats().prefix_cache_hits > hits_before  # the first turn's prompt blocks
    cold = generate(engine_for(bundled_model_q4), {"turn2": follow_up}, PARAMS)["turn2"]
    assert bits(warm) == bits(cold)
