"""A request of a better priority stops the CPU step of worse work in flight
(``inhouse.engine.step_interrupt``) on the bundled SmolLM2: on the kernels' paths (q8, q4;
prefill chunks stop in the Python layer loop, decodes in the C++ one) the stopped steps
change no token (greedy outputs equal an uninterrupted run), give back their drafts'
slots and their tenants' charges, are counted, and leave every block free at the end;
through the ``AsyncEngine`` an interactive request arriving mid-step stops it.
"""

from __future__ import annotations

import asyncio

import pytest
from engine_helpers import add, generate, greedy, run_to_end, step_into
from test_speculative_engine import NGRAM, chat_prompt

from inhouse.engine.async_engine import AsyncEngine
from inhouse.engine.config import EngineConfig
from inhouse.engine.engine import LLMEngine
from inhouse.engine.request import EngineRequest
from inhouse.engine.step_interrupt import StepInterrupt

pytestmark = pytest.mark.slow

MESSAGES = [
    "Repeat this text exactly: The quick brown fox jumps over the lazy dog near the river.",
    "List five fruits.",
    "Copy this code and add a comment to it:\ndef add(a, b):\n    return a + b\n",
    "Why is the sky blue?",
]


def make_engine(loaded, policy: str, **config: object) -> LLMEngine:
    settings = {"max_model_len": 1024, "kv_cache_memory": 64 * 2**20, "seed": 0, **config}
    return LLMEngine(EngineConfig(scheduling_policy=policy, **settings), loaded=loaded)


def better_request_queued(interrupt: StepInterrupt) -> None:
    """As if a request of priority -1 reached the queue just after the engine took its
    commands: the next step of worse work stops before its first layer."""
    interrupt.taking_commands()
    interrupt.arrived(-1)


@pytest.mark.parametrize(
    ("weights", "policy"), [("bundled_model_q8", "priority"), ("bundled_model_q4", "fair")]
)
def test_stopped_steps_change_no_token_and_give_everything_back(weights, policy, request):
    loaded = request.getfixturevalue(weights)
    tok = loaded.tokenizer
    prompts = {f"m{i}": chat_prompt(tok, m) for i, m in enumerate(MESSAGES)}
    params = greedy(12)
    want = generate(make_engine(loaded, policy), prompts, params)
    engine = make_engine(loaded, policy, max_num_batched_tokens=32)  # prompts in chunks
    for i, (rid, prompt) in enumerate(prompts.items()):
        add(engine, rid, prompt, params, priority=1, cache_salt=f"tenant{i % 2}")
    core, results, stopped = engine.core, {}, 0
    assert core.interrupt is not None
    while engine.has_unfinished():
        better_request_queued(core.interrupt)  # every other step is stopped once
        shares = core.scheduler.policy.shares
        before = None if shares is None else {t: shares.vtime(t) for t in ("tenant0", "tenant1")}
        assert engine.step() == []
        stopped += 1
        if shares is not None:
            assert {t: shares.vtime(t) for t in before} == before  # the charge came back
        core.interrupt.taking_commands()  # the engine took the (imagined) request
        step_into(engine, results)
    run_to_end(engine, results)
    assert {r: x.choices[0].token_ids for r, x in results.items()} == {
        r: x.choices[0].token_ids for r, x in want.items()
    }
    stats = engine.stats()
    assert stats.abandoned_steps == stopped > 5 and stats.abandoned_tokens > stopped


def test_a_stopped_verify_step_gives_its_drafts_slots_back(bundled_model_q4):
    tok = bundled_model_q4.tokenizer
    prompts = {f"m{i}": chat_prompt(tok, m) for i, m in enumerate(MESSAGES)}
    params = greedy(24)
    want = generate(make_engine(bundled_model_q4, "priority"), prompts, params)
    engine = make_engine(bundled_model_q4, "priority", speculative=NGRAM)
    for rid, prompt in prompts.items():
        add(engine, rid, prompt, params, priority=1)
    results: dict = {}
    kv, scheduler = engine.core.kv_cache, engine.core.scheduler
    while engine.has_unfinished():
        better_request_queued(engine.core.interrupt)
        assert engine.step() == []
        for seq in scheduler.running:  # no slots held past the tokens: drafts' are back
            assert len(seq.block_table) <= kv.blocks_for_tokens(seq.num_tokens)
        engine.core.interrupt.taking_commands()
        step_into(engine, results)
    run_to_end(engine, results)
    assert {r: x.choices[0].token_ids for r, x in results.items()} == {
        r: x.choices[0].token_ids for r, x in want.items()
    }
    assert engine.stats().spec_decode.num_drafts > 0


def test_fcfs_has_no_interrupt(bundled_model_q4):
    assert make_engine(bundled_model_q4, "fcfs").core.interrupt is None


def test_an_interactive_request_arriving_mid_step_stops_the_batch_step(bundled_model_q4):
    """Batch requests decode with long contexts; interactive ones come one after another.
    Some arrive while a batch step runs, which stops at its next layer; every output is
    the one each request gets alone."""
    tok = bundled_model_q4.tokenizer
    line = "Line {}: the quick brown fox jumps over the lazy dog."
    document = " ".join(line.format(i) for i in range(30))
    batch = {f"b{i}": chat_prompt(tok, f"Summarize ({i}): {document}") for i in range(4)}
    chats = {f"c{i}": chat_prompt(tok, m) for i, m in enumerate(MESSAGES)}
    params, chat_params = greedy(32), greedy(4)
    want = generate(make_engine(bundled_model_q4, "priority"), batch, params)
    want |= generate(make_engine(bundled_model_q4, "priority"), chats, chat_params)
    config = EngineConfig(
        max_model_len=1024, kv_cache_memory=64 * 2**20, seed=0, scheduling_policy="priority"
    )
    engine = AsyncEngine(config, loaded=bundled_model_q4)
    engine.start()

    async def tokens(rid: str, prompt: list[int], sampling, priority: int) -> list[int]:
        got: list[int] = []
        async for out in engine.generate(EngineRequest(rid, prompt, sampling, priority=priority)):
            for delta in out.outputs:
                got += delta.token_ids
        return got

    async def main() -> dict[str, list[int]]:
        running = {rid: asyncio.create_task(tokens(rid, p, params, 1)) for rid, p in batch.items()}
        while engine.stats().num_running < 2:
            await asyncio.sleep(0.01)
        got = {}
        for rid, prompt in chats.items():
            await asyncio.sleep(0.013)  # lands anywhere in a batch step
            got[rid] = await tokens(rid, prompt, chat_params, -1)
        return got | {rid: await task for rid, task in running.items()}

    try:
        got = asyncio.run(main())
        stats = engine.stats()
    finally:
        asyncio.run(engine.shutdown())
    assert got == {rid: r.choices[0].token_ids for rid, r in want.items()}
    assert stats.abandoned_steps >= 1
