"""LLMEngine end to end on a tiny random-weight Llama: batch invariance, prefix cache,
preemption, chunked prefill, stops, seeds, n > 1, aborts, bad input, stats."""

from __future__ import annotations

import random

import pytest
from engine_helpers import (
    TINY_BLOCK,
    Result,
    absorb,
    add,
    generate,
    greedy,
    run_to_end,
    step_into,
    tiny_engine,
)

from inhouse.engine.errors import EngineConfigError, EngineInputError
from inhouse.engine.models.loader import load_model
from inhouse.engine.sampling_params import SamplingParams

NEW_TOKENS = 20


@pytest.fixture(scope="module")
def tiny(tiny_llama_folder):
    return load_model(tiny_llama_folder, dtype="float32")


def random_prompts(count: int, seed: int = 0, prefix: list[int] | None = None) -> dict:
    rng = random.Random(seed)
    lengths = [rng.randint(1, 70) for _ in range(count)]
    return {
        f"r{i}": (prefix or []) + [rng.randrange(3, 384) for _ in range(n)]
        for i, n in enumerate(lengths)
    }


@pytest.fixture(scope="module", params=["tiny_llama_folder", "tiny_mistral_folder"])
def batched(request):
    """The models batch invariance is checked on: full attention, and a sliding window of 8
    (shorter than most prompts, so chunks, preemption and prefix hits cross it)."""
    return load_model(request.getfixturevalue(request.param), dtype="float32")


@pytest.fixture(scope="module")
def alone(batched):
    """Greedy tokens of each of 16 prompts run on its own (and of shared-prefix prompts)."""
    prompts = random_prompts(16)
    prefix = [random.Random(2).randrange(3, 384) for _ in range(40)]
    shared = random_prompts(16, seed=1, prefix=prefix)
    out = {}
    for group in (prompts, shared):
        for rid, prompt in group.items():
            engine = tiny_engine(batched)
            res = generate(engine, {rid: prompt}, greedy(NEW_TOKENS))
            out[tuple(prompt)] = res[rid].choices[0].token_ids
    return prompts, shared, out


def batch_tokens(engine, prompts: dict) -> dict:
    res = generate(engine, prompts, greedy(NEW_TOKENS))
    return {tuple(prompts[rid]): r.choices[0].token_ids for rid, r in res.items()}


def expected(alone_tokens: dict, prompts: dict) -> dict:
    return {tuple(p): alone_tokens[tuple(p)] for p in prompts.values()}


def test_batch_of_16_equals_each_alone(batched, alone):
    prompts, _, alone_tokens = alone
    engine = tiny_engine(batched)
    assert batch_tokens(engine, prompts) == expected(alone_tokens, prompts)
    assert engine.stats().num_preemptions == 0


def test_batch_invariant_under_preemption(batched, alone):
    """With no reserve, admission fills the cache and preemption (the safety net) recomputes."""
    prompts, _, alone_tokens = alone
    engine = tiny_engine(batched, num_blocks=40, max_model_len=128, kv_reserve=0.0)  # 160 slots
    assert batch_tokens(engine, prompts) == expected(alone_tokens, prompts)
    assert engine.stats().num_preemptions > 0


def test_admission_under_kv_pressure_queues_instead_of_preempting(batched, alone):
    """The default reserve admits only what the cache can finish: same tokens, no recompute."""
    prompts, _, alone_tokens = alone
    engine = tiny_engine(batched, num_blocks=40, max_model_len=128)
    most_running = 0
    results: dict[str, Result] = {}
    for rid, prompt in prompts.items():
        add(engine, rid, prompt, greedy(NEW_TOKENS))
    while engine.has_unfinished():
        step_into(engine, results)
        most_running = max(most_running, engine.stats().num_running)
    got = {tuple(prompts[rid]): r.choices[0].token_ids for rid, r in results.items()}
    assert got == {tuple(p): alone_tokens[tuple(p)] for p in prompts.values()}
    assert engine.stats().num_preemptions == 0
    assert 1 < most_running < len(prompts)  # it batched, and it queued


@pytest.mark.parametrize("policy", ["priority", "fair"])
def test_batch_invariant_under_each_policy_with_classes_tenants_and_preemption(
    batched, alone, policy
):
    """Later requests of a better priority and two tenants preempt for seats and for KV
    (no reserve), and the step's prefill is shared: the same tokens as each alone."""
    prompts, _, alone_tokens = alone
    engine = tiny_engine(
        batched,
        num_blocks=40,
        kv_reserve=0.0,
        max_num_seqs=3,
        max_num_batched_tokens=32,
        scheduling_policy=policy,
        long_prefill_token_threshold=12,
    )
    results: dict[str, Result] = {}
    for k, (rid, prompt) in enumerate(prompts.items()):
        if k == 8:
            for _ in range(6):
                step_into(engine, results)
        salt = f"tenant{k % 2}"
        add(engine, rid, prompt, greedy(NEW_TOKENS), priority=1 - 2 * (k >= 8), cache_salt=salt)
    got = {
        tuple(prompts[rid]): r.choices[0].token_ids
        for rid, r in run_to_end(engine, results).items()
    }
    assert got == expected(alone_tokens, prompts)
    causes = engine.stats().preemptions_by_cause
    assert causes.get("priority", 0) > 0 and causes.get("kv", 0) > 0


def test_batch_invariant_under_chunked_prefill(batched, alone):
    prompts, _, alone_tokens = alone
    engine = tiny_engine(batched, max_num_batched_tokens=7)
    assert max(len(p) for p in prompts.values()) > 7
    assert batch_tokens(engine, prompts) == expected(alone_tokens, prompts)


def test_batch_invariant_with_prefix_cache_hits(batched, alone):
    _, shared, alone_tokens = alone
    engine = tiny_engine(batched)
    first = dict(list(shared.items())[:1])
    batch_tokens(engine, first)
    assert batch_tokens(engine, shared) == expected(alone_tokens, shared)
    stats = engine.stats()
    assert stats.prefix_cache_hits >= 15 * (40 // TINY_BLOCK) * TINY_BLOCK


def test_second_request_with_long_prefix_reports_cached_tokens_unless_salted(tiny):
    engine = tiny_engine(tiny)
    prefix = random_prompts(1, seed=5)["r0"] + list(range(3, 43))
    res = generate(engine, {"a": [*prefix, 7]}, greedy(4))
    assert res["a"].num_cached_tokens == 0
    res = generate(engine, {"b": [*prefix, 9, 9]}, greedy(4))
    assert res["b"].num_cached_tokens == len(prefix) // TINY_BLOCK * TINY_BLOCK
    res = generate(engine, {"c": [*prefix, 9, 9]}, greedy(4), cache_salt="tenant-2")
    assert res["c"].num_cached_tokens == 0
    res = generate(engine, {"d": [*prefix, 5]}, greedy(4), cache_salt="tenant-2")
    assert res["d"].num_cached_tokens > 0
    stats = engine.stats()
    assert stats.prefix_cache_queries == 4 * len(prefix) + 1 + 2 + 2 + 1
    assert stats.prefix_cache_hits == 2 * (len(prefix) // TINY_BLOCK * TINY_BLOCK)


def test_prefix_caching_off_reports_no_hits(tiny):
    engine = tiny_engine(tiny, enable_prefix_caching=False)
    prompt = list(range(3, 60))
    generate(engine, {"a": prompt}, greedy(2))
    assert generate(engine, {"b": prompt}, greedy(2))["b"].num_cached_tokens == 0


def test_stop_string_split_across_tokens_is_excluded_and_never_streamed(tiny):
    prompt = list(range(10, 30))
    free = generate(tiny_engine(tiny), {"x": prompt}, greedy(NEW_TOKENS))["x"].choices[0]
    tok = tiny.tokenizer
    pieces = [tok.decode(free.token_ids[: i + 1]) for i in range(len(free.token_ids))]
    cut = next(i for i in range(3, len(pieces)) if len(pieces[i]) - len(pieces[i - 2]) >= 2)
    stop = pieces[cut][len(pieces[cut - 2]) - 1 :]  # spans at least two tokens
    assert stop not in pieces[cut - 1]
    res = generate(tiny_engine(tiny), {"x": prompt}, greedy(NEW_TOKENS, stop=[stop]))["x"]
    choice = res.choices[0]
    head = free.text[: free.text.index(stop)]
    assert choice.text == head and choice.finish_reason == "stop" and choice.stop_reason == stop
    for i in range(len(choice.deltas)):
        assert head.startswith("".join(choice.deltas[: i + 1]))
    with_stop = generate(
        tiny_engine(tiny),
        {"x": prompt},
        greedy(NEW_TOKENS, stop=[stop], include_stop_str_in_output=True),
    )["x"].choices[0]
    assert with_stop.text == head + stop


def test_stop_token_ids_eos_and_min_tokens(tiny):
    prompt = list(range(40, 50))
    free = generate(tiny_engine(tiny), {"x": prompt}, greedy(NEW_TOKENS))["x"].choices[0]
    stop_token = free.token_ids[5]
    first = free.token_ids.index(stop_token)
    res = generate(
        tiny_engine(tiny), {"x": prompt}, greedy(NEW_TOKENS, stop_token_ids=[stop_token])
    )
    choice = res["x"].choices[0]
    assert choice.token_ids == free.token_ids[: first + 1]
    assert (choice.finish_reason, choice.stop_reason) == ("stop", stop_token)
    eos = next(iter(tiny.eos_token_ids))
    engine = tiny_engine(tiny)
    engine.core.scheduler.eos_token_ids = frozenset({stop_token})  # make that token the model's EOS
    res = generate(engine, {"x": prompt}, SamplingParams(temperature=0, max_tokens=NEW_TOKENS))
    choice = res["x"].choices[0]
    assert choice.token_ids == free.token_ids[: first + 1] and choice.stop_reason is None
    assert choice.finish_reason == "stop" and eos not in choice.token_ids[:-1]
    late = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, min_tokens=first + 2)
    engine = tiny_engine(tiny)
    engine.core.scheduler.eos_token_ids = frozenset({stop_token})
    choice = generate(engine, {"x": prompt}, late)["x"].choices[0]
    assert len(choice.token_ids) >= first + 2 and stop_token not in choice.token_ids[: first + 1]


def test_length_limits_max_tokens_and_max_model_len(tiny):
    engine = tiny_engine(tiny, max_model_len=40)
    res = generate(
        engine,
        {"a": list(range(3, 13))},
        SamplingParams(temperature=0, max_tokens=None, ignore_eos=True),
    )
    choice = res["a"].choices[0]
    assert len(choice.token_ids) == 30 and choice.finish_reason == "length"


def test_seeded_sampling_is_reproducible_whatever_the_batch(tiny):
    params = SamplingParams(
        temperature=1.0, top_p=0.9, seed=1234, max_tokens=NEW_TOKENS, ignore_eos=True
    )
    prompt = list(range(60, 80))
    alone = generate(tiny_engine(tiny), {"s": prompt}, params)["s"].choices[0].token_ids
    engine = tiny_engine(tiny, seed=99)
    others = random_prompts(6, seed=3)
    for rid, p in others.items():
        add(engine, rid, p, SamplingParams(temperature=0.8, max_tokens=NEW_TOKENS))
    add(engine, "s", prompt, params)
    assert run_to_end(engine)["s"].choices[0].token_ids == alone


def test_n_siblings_share_prompt_blocks_and_finish_independently(tiny):
    engine = tiny_engine(tiny)
    prompt = list(range(100, 130))
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=12, stop_token_ids=[])
    add(engine, "n", prompt, params)
    results: dict[str, Result] = {}
    step_into(engine, results)
    step_into(engine, results)
    seqs = engine.core.scheduler.sequences("n")
    shared = seqs[0].block_table[: len(prompt) // TINY_BLOCK]
    assert all(s.block_table[: len(shared)] == shared for s in seqs)
    assert all(engine.core.kv_cache.pool.blocks[b].ref_cnt == 3 for b in shared)
    res = run_to_end(engine, results)["n"]
    tokens = [res.choices[i].token_ids for i in range(3)]
    assert len({tuple(t) for t in tokens}) == 3
    assert all(res.choices[i].finish_reason == "length" for i in range(3))
    alone = generate(
        tiny_engine(tiny),
        {"n": prompt},
        SamplingParams(n=1, temperature=1.0, seed=5, max_tokens=12),
    )
    assert alone["n"].choices[0].token_ids == tokens[0]


def test_siblings_finish_at_different_steps(tiny):
    engine = tiny_engine(tiny)
    prompt = list(range(150, 170))
    probe = generate(
        engine, {"p": prompt}, SamplingParams(n=4, temperature=1.5, seed=3, max_tokens=NEW_TOKENS)
    )
    early = probe["p"].choices[1].token_ids[2]
    params = SamplingParams(
        n=4, temperature=1.5, seed=3, max_tokens=NEW_TOKENS, stop_token_ids=[early]
    )
    add(engine, "p", prompt, params)
    finished_at = {}
    step = 0
    while engine.has_unfinished():
        step += 1
        for out in engine.step():
            for c in out.outputs:
                if c.finish_reason:
                    finished_at[c.index] = step
            assert out.finished == (len(finished_at) == 4)
    assert finished_at[1] < max(finished_at.values())


def test_abort_mid_generation_frees_blocks_and_others_continue(tiny):
    engine = tiny_engine(tiny)
    prompts = random_prompts(4, seed=9)
    reference = generate(tiny_engine(tiny), {"r1": prompts["r1"]}, greedy(NEW_TOKENS))
    for rid, p in prompts.items():
        add(engine, rid, p, greedy(NEW_TOKENS, n=2 if rid == "r0" else 1))
    results: dict[str, Result] = {}
    for _ in range(5):
        step_into(engine, results)
    final = engine.abort("r0")
    absorb(results, final)
    assert final.finished and {c.finish_reason for c in final.outputs} == {"abort"}
    assert engine.abort("r0") is None
    add(engine, "late", prompts["r2"], greedy(3))
    engine.abort("late")  # still waiting: aborted before it ever ran
    res = run_to_end(engine, results)
    assert res["r1"].choices[0].token_ids == reference["r1"].choices[0].token_ids
    assert engine.stats().finished_requests["abort"] == 2


def test_bad_input_is_rejected_before_scheduling_and_others_keep_going(tiny):
    engine = tiny_engine(tiny, max_model_len=64)
    good = list(range(3, 20))
    reference = generate(tiny_engine(tiny, max_model_len=64), {"g": good}, greedy(10))
    add(engine, "g", good, greedy(10))
    results: dict[str, Result] = {}
    step_into(engine, results)
    cases = [
        ("long", list(range(3, 67)), greedy(1), "64 tokens.*max_model_len is 64"),
        ("long2", list(range(3, 100)), greedy(1), "97 tokens"),
        ("sum", list(range(3, 53)), greedy(20), r"50 tokens\) plus max_tokens \(20\).*64"),
        ("empty", [], greedy(1), "empty"),
        ("vocab", [3, 100_000], greedy(1), r"\[0, 384\)"),
        ("g", good, greedy(1), "already running"),
    ]
    for rid, prompt, params, message in cases:
        with pytest.raises(EngineInputError, match=message):
            add(engine, rid, prompt, params)
    with pytest.raises(EngineInputError, match="cache_salt"):
        add(engine, "salt", good, greedy(1), cache_salt="")
    res = run_to_end(engine, results)
    assert list(res) == ["g"]
    assert res["g"].choices[0].token_ids == reference["g"].choices[0].token_ids


def test_logprobs_in_outputs(tiny):
    engine = tiny_engine(tiny)
    res = generate(engine, {"l": list(range(3, 20))}, greedy(5, logprobs=3))
    choice = res["l"].choices[0]
    assert [lp.token_id for lp in choice.logprobs] == choice.token_ids
    for lp in choice.logprobs:
        assert len(lp.top) == 3 and lp.top[0][0] == lp.token_id  # greedy picks the top-1
        assert lp.logprob == pytest.approx(lp.top[0][2]) and lp.logprob <= 0
        assert lp.token == tiny.tokenizer.decode([lp.token_id])


def test_stats_and_timings(tiny):
    engine = tiny_engine(tiny, max_num_seqs=2)
    for rid, p in random_prompts(4, seed=4).items():
        add(engine, rid, p, greedy(3))
    engine.step()
    stats = engine.stats()
    assert (stats.num_running, stats.num_waiting) == (2, 2)
    assert 0 < stats.kv_cache_usage < 1
    res = run_to_end(engine)
    stats = engine.stats()
    assert stats.kv_cache_usage == 0 and stats.generation_tokens == 12
    assert stats.finished_requests == {"length": 4}
    for result in res.values():
        timing = result.outputs[-1].timing
        assert timing is not None and timing.num_generation_tokens == 3
        assert 0 <= timing.queue_time <= timing.time_to_first_token <= timing.e2e_latency


def test_kv_budget_must_hold_one_full_sequence(tiny):
    with pytest.raises(EngineConfigError, match="fewer than max_model_len 128"):
        tiny_engine(tiny, num_blocks=10, max_model_len=128)
    engine = tiny_engine(tiny, num_blocks=10, max_model_len=None)
    assert engine.info.max_model_len == 10 * TINY_BLOCK
    res = generate(
        engine,
        {"a": list(range(3, 30))},
        SamplingParams(temperature=0, max_tokens=None, ignore_eos=True),
    )
    assert len(res["a"].choices[0].token_ids) == 40 - 27


def test_default_cpu_kv_budget_is_a_quarter_of_memory_capped_and_says_why():
    from inhouse.engine.config import DEFAULT_KV_CAP_CPU, _mem_available, default_kv_cache_memory

    quarter = _mem_available() // 4
    memory, why = default_kv_cache_memory("cpu")
    assert abs(memory - min(quarter, DEFAULT_KV_CAP_CPU)) < 2**24  # free memory moves a little
    assert "a quarter of" in why and "available memory" in why
    if quarter > DEFAULT_KV_CAP_CPU:
        assert "capped at 4.0 GiB" in why
        one_sequence = DEFAULT_KV_CAP_CPU + 2**20
        assert default_kv_cache_memory("cpu", one_sequence)[0] == min(one_sequence, quarter)
    assert default_kv_cache_memory("cpu", 2**60)[0] <= quarter + 2**24  # never past the quarter
