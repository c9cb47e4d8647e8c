"""Scheduler decisions: token budget, chunked prefill, preemption, admission, siblings.

The model is out of the loop here: a step "computes" what was scheduled and appends
a token to every sequence that caught up, exactly what LLMEngine.step does around it.
"""

from __future__ import annotations

from inhouse.engine.kv_cache import KVCacheManager
from inhouse.engine.sampling import SamplingParams
from inhouse.engine.scheduler import Scheduler, SchedulerOutput
from inhouse.engine.sequence import Sequence, SequenceStatus

BS = 4


def make_scheduler(num_blocks: int = 64, max_num_seqs: int = 8, budget: int = 64) -> Scheduler:
    return Scheduler(KVCacheManager(num_blocks, BS), max_num_seqs, budget)


def make_seq(prompt_len: int, request_id: str = "r", index: int = 0, n: int = 1) -> Sequence:
    tokens = [(7 * len(request_id) + i) % 50 for i in range(prompt_len)]
    return Sequence(request_id, tokens, SamplingParams(n=n), index=index)


def step(sched: Scheduler, max_output: int = 1000) -> SchedulerOutput:
    out = sched.schedule()
    for seq, n in out.scheduled:
        seq.num_computed_tokens += n
        sched.kv_cache.cache_computed_blocks(seq)
        if seq.num_computed_tokens == seq.num_tokens:
            seq.token_ids.append(1)
            if seq.num_output_tokens >= max_output:
                sched.finish(seq, "length")
    return out


def test_running_first_then_waiting_under_one_token_budget():
    sched = make_scheduler(budget=10)
    a, b = make_seq(6, "a"), make_seq(6, "b")
    sched.add([a])
    sched.add([b])
    out = step(sched)
    assert [(s.request_id, n) for s, n in out.scheduled] == [("a", 6), ("b", 4)]  # b chunked
    out = step(sched)
    assert [(s.request_id, n) for s, n in out.scheduled] == [("a", 1), ("b", 2)]
    out = step(sched)
    assert [(s.request_id, n) for s, n in out.scheduled] == [("a", 1), ("b", 1)]


def test_long_prompt_is_prefilled_in_chunks():
    sched = make_scheduler(budget=8)
    seq = make_seq(30)
    sched.add([seq])
    chunks = [step(sched).num_tokens for _ in range(4)]
    assert chunks == [8, 8, 8, 6]
    assert seq.num_output_tokens == 1


def test_max_num_seqs_limits_admission():
    sched = make_scheduler(max_num_seqs=2)
    for rid in "abc":
        sched.add([make_seq(3, rid)])
    step(sched)
    assert len(sched.running) == 2 and len(sched.waiting) == 1


def test_out_of_blocks_preempts_newest_running_and_requeues_it_first():
    sched = make_scheduler(num_blocks=4, budget=64)
    old, new = make_seq(4, "old"), make_seq(4, "new")
    sched.add([old])
    sched.add([new])
    step(sched)  # both prefill: 2 blocks used; each then holds 5 tokens
    waiting = make_seq(2, "w")
    sched.add([waiting])
    step(sched)  # both decode into a second block: pool full, waiting not admitted
    assert sched.kv_cache.num_free_blocks == 0
    for _ in range(3):
        step(sched)
    out = step(sched)  # old needs a third block: new is preempted
    assert [s.request_id for s in out.preempted] == ["new"]
    assert new.status is SequenceStatus.WAITING and new.block_table == []
    assert new.num_computed_tokens == 0
    assert list(sched.waiting)[:2] == [new, waiting]
    assert sched.num_preemptions == 1
    assert [s.request_id for s, _ in out.scheduled] == ["old"]  # no admission this step
    assert sched.kv_cache.counters.queries == 8  # only admitted lookups count, once each


def test_single_request_always_progresses_when_pool_holds_max_model_len():
    sched = make_scheduler(num_blocks=5, budget=6)  # 20 slots
    seq = make_seq(9)
    sched.add([seq])
    for _ in range(40):
        if seq.num_tokens == 20:
            break
        step(sched)
    assert seq.num_tokens == 20 and sched.num_preemptions == 0


def test_preempted_sequence_recomputes_from_prefix_cache_and_continues():
    sched = make_scheduler(num_blocks=6, budget=64)
    a, b = make_seq(8, "a"), make_seq(8, "bb")
    sched.add([a])
    sched.add([b])
    while not sched.num_preemptions:
        step(sched)
    tokens_before = list(b.token_ids)
    sched.finish(a, "length")
    out = step(sched)
    [(seq, n)] = out.scheduled
    assert seq is b and b.num_cached_tokens == 0  # first admission had no hit
    assert b.num_computed_tokens == len(tokens_before)
    assert n < len(tokens_before)  # full blocks came back from the prefix cache
    assert b.token_ids[: len(tokens_before)] == tokens_before


def test_siblings_wait_for_leader_prompt_then_share_its_blocks():
    sched = make_scheduler(budget=64)
    seqs = [make_seq(10, "r", index=i, n=3) for i in range(3)]
    sched.add(seqs)
    out = step(sched)
    assert [s.index for s, _ in out.scheduled] == [0]
    out = step(sched)
    assert sorted(s.index for s, _ in out.scheduled) == [0, 1, 2]
    shared = seqs[0].block_table[:2]
    for sibling in seqs[1:]:
        assert sibling.block_table[:2] == shared
        assert sibling.block_table[2] != seqs[0].block_table[2]
    assert all(sched.kv_cache.pool.blocks[i].ref_cnt == 3 for i in shared)


def test_finish_and_preemption_return_every_block():
    sched = make_scheduler(num_blocks=10, budget=16)
    seqs = [make_seq(5 + i, f"r{i}") for i in range(6)]
    for seq in seqs:
        sched.add([seq])
    for _ in range(30):
        step(sched, max_output=6)
    for seq in list(sched.running) + list(sched.waiting):
        sched.finish(seq, "abort")
    assert sched.num_unfinished == 0
    assert sched.kv_cache.num_free_blocks == 10
    assert all(b.ref_cnt == 0 for b in sched.kv_cache.pool.blocks)
    assert sched.num_preemptions > 0
