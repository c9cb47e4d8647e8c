"""The priority and fair scheduling policies on the real Scheduler and KVCacheManager (the
model out of the loop: every sampled token is given, as in ``test_scheduler``): order,
shared prefill budget, tenants' shares, yielding to a better priority, and its bounds."""

from __future__ import annotations

from collections import Counter

import pytest
from test_scheduler import BS, EOS, step

from inhouse.engine.kv_cache import KVCacheManager
from inhouse.engine.sampling_params import SamplingParams
from inhouse.engine.scheduler import Scheduler
from inhouse.engine.sequence import Sequence, SequenceStatus
from inhouse.scheduling.background import GAP_ROWS, URGENT_HOLD_STEPS
from inhouse.scheduling.fair_share import FAIR_IDLE_GRACE_STEPS, FAIR_QUANTUM_TOKENS, TenantShares

_arrivals = iter(range(1, 10**9))


def make_scheduler(
    policy: str,
    max_num_seqs: int = 64,
    budget: int = 64,
    prefill_cap: int | None = None,
    num_blocks: int = 512,
    background_rows: int = 0,
) -> Scheduler:
    kv = KVCacheManager(num_blocks, BS)
    return Scheduler(
        kv, max_num_seqs, budget, 2000, {EOS}, 1.0, policy, prefill_cap, background_rows
    )


def make_seq(
    rid: str, prompt_len: int = 4, priority: int = 0, tenant: str | None = None, max_tokens=500
) -> Sequence:
    tokens = [3 + (sum(map(ord, rid)) + 7 * i) % 300 for i in range(prompt_len)]
    params = SamplingParams(max_tokens=max_tokens)
    return Sequence(
        rid, tokens, params, cache_salt=tenant, priority=priority, arrival_time=next(_arrivals)
    )


def scheduled(out) -> dict[str, int]:
    return {seq.request_id: n for seq, n in out.scheduled}


def test_priority_admits_by_priority_then_arrival_and_fcfs_by_arrival():
    for policy, first in (("fcfs", "late"), ("priority", "urgent")):
        sched = make_scheduler(policy, max_num_seqs=1)
        for rid, priority in (("late", 1), ("normal", 0), ("urgent", -1), ("normal2", 0)):
            sched.add([make_seq(rid, priority=priority, max_tokens=1)])
        order = []
        while sched.has_unfinished():
            order += [rid for rid in scheduled(step(sched)) if rid not in order]
        expected = ["late", "normal", "urgent", "normal2"]
        if policy == "priority":
            expected = ["urgent", "normal", "normal2", "late"]
        assert order == expected and order[0] == first


def test_a_long_prompt_shares_the_step_with_another_tenants_request_under_fair():
    """fcfs gives the running long prompt the whole step; fair gives the short request of
    the other tenant its prefill first and the long one what is left of the prefill cap."""
    got = {}
    for policy in ("fcfs", "fair"):
        sched = make_scheduler(policy, budget=64, prefill_cap=32)
        sched.add([make_seq("long", 400, tenant="etl")])
        step(sched)
        sched.add([make_seq("short", 10, tenant="alice")])
        got[policy] = scheduled(step(sched))
    assert got["fcfs"] == {"long": 64}
    assert got["fair"] == {"short": 10, "long": 22}


def test_a_lone_sequence_gets_the_whole_step_budget():
    sched = make_scheduler("fair", budget=64, prefill_cap=16)
    sched.add([make_seq("alone", 100)])
    assert scheduled(step(sched)) == {"alone": 64}


def test_a_better_priority_prefill_stops_worse_prefills_but_not_their_decodes():
    sched = make_scheduler("priority", budget=64, prefill_cap=48)
    sched.add([make_seq("decoding", 4, priority=1)])
    step(sched)
    sched.add([make_seq("batch", 300, priority=1)])
    step(sched)
    sched.add([make_seq("chat", 20, priority=-1)])
    assert scheduled(step(sched)) == {"chat": 20, "decoding": 1}
    assert scheduled(step(sched)) == {
        "chat": 1,
        "decoding": 1,
        "batch": 48,
    }  # decodes are not prefill


def decode_shares(policy: str, counts: dict[str, int], steps: int = 200) -> Counter[str]:
    """Tokens each tenant got over ``steps`` steps with ``counts`` requests in flight each
    (prompts already computed, so every token is a decode)."""
    sched = make_scheduler(policy, budget=256, num_blocks=4096)
    for tenant, count in counts.items():
        for i in range(count):
            sched.add([make_seq(f"{tenant}{i}", 8, tenant=tenant, max_tokens=400)])
    step(sched)  # every prompt is computed in this first step
    tokens: Counter[str] = Counter()
    for _ in range(steps):
        for seq, n in step(sched).scheduled:
            tokens[seq.cache_salt] += n
    return tokens


def test_fair_gives_tenants_equal_tokens_whatever_their_requests_in_flight():
    fcfs = decode_shares("fcfs", {"twelve": 12, "four": 4})
    assert fcfs["twelve"] == 3 * fcfs["four"]
    fair = decode_shares("fair", {"twelve": 12, "four": 4})
    assert fair["four"] == fcfs["four"]  # the smaller tenant keeps every seat it fills
    assert abs(fair["twelve"] - fair["four"]) <= FAIR_QUANTUM_TOKENS + 12  # and one step


def test_a_tenant_waiting_for_a_seat_does_not_hold_the_seated_ones_still():
    sched = make_scheduler("fair", max_num_seqs=2, num_blocks=4096)
    for i in range(2):
        sched.add([make_seq(f"a{i}", 8, tenant="a", max_tokens=400)])
    step(sched)
    sched.add([make_seq("c", 8, tenant="c", max_tokens=400)])  # no seat: same priority
    decoded = sum(n for _ in range(200) for _, n in step(sched).scheduled)
    assert decoded == 400 and sched.waiting[0].request_id == "c"


def test_priority_gives_no_share_to_tenants_and_fair_shares_only_within_a_level():
    priority = decode_shares("priority", {"twelve": 12, "four": 4})
    assert priority["twelve"] == 3 * priority["four"]
    sched = make_scheduler("fair", budget=256, num_blocks=4096)
    for i in range(12):
        sched.add([make_seq(f"batch{i}", 8, priority=1, tenant="etl", max_tokens=400)])
    sched.add([make_seq("chat", 8, priority=-1, tenant="alice", max_tokens=400)])
    step(sched)
    # the chat's tenant is served first, but the batch level below is not held to its share
    assert len(step(sched).scheduled) == 13


def test_a_tenant_back_from_idle_keeps_at_most_a_quantum_of_credit():
    shares = TenantShares()
    shares.activate("a")
    shares.activate("b")  # a newcomer starts a quantum below the least active one
    q = FAIR_QUANTUM_TOKENS
    assert (shares.vtime("a"), shares.vtime("b")) == (-q, -2 * q)
    shares.charge([(make_seq("x", tenant="a"), 5000)])
    shares.charge([(make_seq("y", tenant="b"), 4000)])
    b = shares.vtime("b")
    shares.release("b")
    shares.charge([(make_seq("x", tenant="a"), 5000)])
    shares.activate("b")  # back within the grace: its deficit stands
    assert shares.vtime("b") == b
    shares.release("b")
    for _ in range(FAIR_IDLE_GRACE_STEPS + 1):
        shares.charge([])
    shares.activate("b")  # a long gap: its credit is held to the quantum
    assert shares.vtime("b") == shares.vtime("a") - q > b
    a = shares.vtime("a")
    for tenant in ("a", "b"):
        shares.release(tenant)
    for _ in range(FAIR_IDLE_GRACE_STEPS + 1):
        shares.charge([])
    shares.activate("b")  # after an idle engine the clock is where it stopped
    shares.activate("a")
    assert shares.vtime("a") == a and shares.vtime("b") == a - q


def test_a_tenant_with_one_request_at_a_time_keeps_its_share_across_the_gaps():
    """Each of the small tenant's requests is replaced two steps after it ends (a client's
    round trip); the other tenant, eight in flight, gains nothing in those gaps."""
    sched = make_scheduler("fair", budget=256, num_blocks=4096)
    tokens: Counter[str] = Counter()
    gap = 0
    for i in range(8):
        sched.add([make_seq(f"big{i}", 8, tenant="big", max_tokens=10_000)])
    sched.add([make_seq("small0", 8, tenant="small", max_tokens=8)])
    for n in range(400):
        for seq, count in step(sched).scheduled:
            tokens[seq.cache_salt] += count
        if not any(s.cache_salt == "small" for s in [*sched.running, *sched.waiting]):
            gap += 1
            if gap == 2:
                sched.add([make_seq(f"small{n}", 8, tenant="small", max_tokens=8)])
                gap = 0
    assert abs(tokens["big"] - tokens["small"]) <= 0.1 * tokens["small"], tokens


def test_a_waiting_better_priority_preempts_the_worst_running_one_once_a_step():
    sched = make_scheduler("priority", max_num_seqs=3)
    batch = [make_seq(f"batch{i}", 8, priority=1) for i in range(3)]
    for seq in batch:
        sched.add([seq])
    step(sched)
    for i in range(2):
        sched.add([make_seq(f"chat{i}", 8, priority=-1)])
    out = step(sched)
    assert out.preempted == [batch[2]] and "chat0" in scheduled(out)  # the newest batch
    out = step(sched)
    assert out.preempted == [batch[1]] and "chat1" in scheduled(out)
    assert sched.preemptions == Counter(priority=2)
    assert batch[2].status is SequenceStatus.WAITING and batch[1].status is SequenceStatus.WAITING


def test_equal_or_worse_priorities_never_preempt_and_fcfs_never_yields():
    for policy, priority in (("priority", 1), ("fair", 1), ("fcfs", -1)):
        sched = make_scheduler(policy, max_num_seqs=2)
        for i in range(2):
            sched.add([make_seq(f"run{i}", 8, priority=1)])
        step(sched)
        sched.add([make_seq("late", 8, priority=priority, tenant="other")])
        for _ in range(5):
            step(sched)
        assert sched.num_preemptions == 0, policy


def test_a_preempted_sequence_recomputes_its_prompt_from_the_prefix_cache():
    sched = make_scheduler("priority", max_num_seqs=1, budget=256)
    victim = make_seq("batch", 200, priority=1)
    sched.add([victim])
    for _ in range(3):
        step(sched)
    sched.add([make_seq("chat", 8, priority=-1, max_tokens=2)])
    step(sched)
    assert victim.status is SequenceStatus.WAITING
    while victim.status is not SequenceStatus.RUNNING:
        out = step(sched)
    # back with its full blocks from the cache: only the tail past them is computed again
    assert scheduled(out)["batch"] <= BS + 2 and sched.kv_cache.counters.hits >= 200 - BS


@pytest.mark.parametrize("policy", ["priority", "fair"])
def test_priority_preemptions_stay_bounded_under_a_stream_of_urgent_requests(policy):
    """Forty short urgent requests arriving one a step beside batch work fill the seats:
    each costs at most one preemption, and every batch sequence still finishes."""
    sched = make_scheduler(policy, max_num_seqs=4)
    batch = [make_seq(f"batch{i}", 40, priority=1, max_tokens=30) for i in range(4)]
    for seq in batch:
        sched.add([seq])
    for _ in range(3):
        step(sched)
    assert len(sched.running) == 4
    for i in range(40):
        sched.add([make_seq(f"chat{i}", 6, priority=-1, tenant=f"u{i % 3}", max_tokens=3)])
        step(sched)
    for _ in range(1000):
        if not sched.has_unfinished():
            break
        step(sched)
    assert not sched.has_unfinished() and all(s.finish_reason == "length" for s in batch)
    assert 0 < sched.preemptions["priority"] <= 40 and sched.preemptions["kv"] == 0
    assert sched.kv_cache.num_free_blocks == 512


@pytest.mark.parametrize("policy", ["priority", "fair"])
def test_batch_decodes_take_turns_in_short_steps_while_interactive_work_is_active(policy):
    """8 batch sequences decode together; once an interactive request comes, its prefill
    step runs it alone, then each step runs it and 2 batch decodes, the batch in turns (each
    gets a token every 4 steps); some steps after it is done, the batch runs whole again."""
    sched = make_scheduler(policy, background_rows=2)
    for i in range(8):
        sched.add([make_seq(f"b{i}", 4, priority=1, tenant="etl", max_tokens=60)])
    step(sched)  # the 8 prompts
    assert len(scheduled(step(sched))) == 8
    sched.add([make_seq("chat", 10, priority=-1, tenant="alice", max_tokens=9)])
    assert scheduled(step(sched)) == {"chat": 10}
    turns: Counter[str] = Counter()
    for _ in range(8):
        got = scheduled(step(sched))
        assert got.pop("chat") == 1 and len(got) == 2
        turns.update(got)
    assert turns == {f"b{i}": 2 for i in range(8)}
    assert "chat" not in scheduled(step(sched))  # finished: 9 tokens
    for _ in range(URGENT_HOLD_STEPS):
        step(sched)
    assert len(scheduled(step(sched))) == 8


@pytest.mark.parametrize("policy", ["priority", "fair"])
def test_between_interactive_requests_the_batch_runs_one_decode_and_no_prefill(policy):
    """Once the chat is done (urgency still held), each step runs GAP_ROWS batch decode in
    turns and the waiting batch prompt does not start: the client's next chat will wait
    for that step. A chat back decodes beside 2 batch decodes again."""
    sched = make_scheduler(policy, max_num_seqs=8, background_rows=2)
    for i in range(6):
        sched.add([make_seq(f"b{i}", 4, priority=1, tenant="etl", max_tokens=200)])
    step(sched)
    sched.add([make_seq("chat", 10, priority=-1, tenant="alice", max_tokens=3)])
    for _ in range(3):  # its prefill alone, then two decodes beside 2 batch rows
        step(sched)
    sched.add([make_seq("late", 40, priority=1, tenant="etl", max_tokens=20)])
    turns: Counter[str] = Counter()
    for _ in range(6):
        got = scheduled(step(sched))
        assert len(got) == GAP_ROWS and "late" not in got and "chat" not in got
        turns.update(got)
    assert turns == {f"b{i}": 1 for i in range(6)}  # in turns
    sched.add([make_seq("chat2", 10, priority=-1, tenant="alice", max_tokens=3)])
    assert scheduled(step(sched)) == {"chat2": 10}
    got = scheduled(step(sched))
    assert got.pop("chat2") == 1 and len([r for r, n in got.items() if n == 1]) == 2
    assert got.get("late", 0) > 1  # prefill runs again beside a decoding chat


def test_no_background_cap_without_better_work_or_under_fcfs():
    for policy in ("fcfs", "priority"):
        sched = make_scheduler(policy, background_rows=2)
        for i in range(6):
            sched.add([make_seq(f"b{i}", 4, priority=1, max_tokens=60)])
        step(sched)
        assert len(scheduled(step(sched))) == 6
