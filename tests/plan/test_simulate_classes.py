"""The simulation's traffic classes and scheduling policies, on cases known by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inhouse.plan.errors import PlanError
from inhouse.plan.mixed import BatchLoad, InteractiveLoad, plan_mixed
from inhouse.plan.perf_model import StepCost
from inhouse.plan.sim_engine import SchedulerLimits
from inhouse.plan.sim_request import SimRequest
from inhouse.plan.simulate import Workload, simulate_workloads
from inhouse.scheduling.fair_share import TenantShares

# 20 ms a step + 0.5 ms a token past 20 tokens + 1 ms a decode; attention is free.
COST = StepCost(base_s=0.02, weights_s=0.01, token_s=0.0005, seq_s=0.001, context_s=0.0, pair_s=0.0)
FLAT = StepCost(base_s=0.05, weights_s=0.0, token_s=0.0, seq_s=0.0, context_s=0.0, pair_s=0.0)


def batch_and_chat(policy: str, **limits: int) -> tuple:
    """Two 1,000-token batch prompts at 0 s, one 10-token chat 1 ms later."""
    chat = Workload(10, 2, 1, concurrency=1, priority=-1, tenant="i", delay_s=0.001)
    batch = Workload(1000, 50, None, concurrency=2, priority=1, tenant="b")
    return simulate_workloads(COST, [chat, batch], SchedulerLimits(policy=policy, **limits))


def test_fcfs_makes_a_chat_wait_for_the_batch_prefill_priority_lets_it_through() -> None:
    chat, _ = batch_and_chat("fcfs")
    # Step 1 prefills both prompts (2,000 tokens: 1.02 s); the chat joins step 2 (32 ms).
    assert chat.ttft == [pytest.approx(1.02 + 0.032 - 0.001)]
    for cap in (256, 0):
        chat, _ = batch_and_chat("priority", long_prefill_token_threshold=cap)
        # Step 1 is the batch's alone and the chat, better, arrives 1 ms in: it stops there
        # (nothing computed); step 2 is the chat's alone, the batch's prefill waiting behind
        # the better priority (30 ms).
        assert chat.ttft == [pytest.approx(0.030)]
    # With a cap the chat's next token comes beside 256 batch prefill tokens; without one,
    # beside the batch's whole 2,000 (step 1's 1.02 s and the chat's decode).
    chat, _ = batch_and_chat("priority", long_prefill_token_threshold=256)
    assert chat.tpot == [pytest.approx(0.02 + 0.0005 * 257 + 0.001)]
    chat, _ = batch_and_chat("priority", long_prefill_token_threshold=0)
    assert chat.tpot == [pytest.approx(1.02 + 0.0005 + 0.001)]


def test_a_chat_preempts_batch_work_that_holds_every_seat_at_most_once_a_step() -> None:
    chat = Workload(8, 4, 3, concurrency=1, priority=-1, tenant="i", delay_s=0.01)
    batch = Workload(8, 400, None, concurrency=2, priority=1, tenant="b")
    seats = {"max_num_seqs": 2}
    fcfs_chat, _ = simulate_workloads(FLAT, [chat, batch], SchedulerLimits(**seats))
    prio_chat, prio_batch = simulate_workloads(
        FLAT, [chat, batch], SchedulerLimits(policy="priority", **seats)
    )
    assert fcfs_chat.ttft_p(50) > 300 * 0.05  # waits for a 400-token batch answer to end
    # The first chat stops the batch step it arrived in and runs in the next, a batch
    # sequence preempted for it; the seat it frees at the end goes to the next chat, and so on.
    assert prio_chat.ttft == [pytest.approx(t) for t in (0.05, 0.05, 0.05)]
    assert prio_batch.preemptions == 1


def rates(policy: str, spread: float = 0.2) -> float:
    """Output tokens/s of a tenant with 12 in flight over one with 4, both backlogged."""
    many = Workload(16, 200, None, concurrency=12, tenant="many", spread=spread)
    few = Workload(16, 200, 40, concurrency=4, tenant="few", spread=spread, seed=1)
    got_many, got_few = simulate_workloads(FLAT, [many, few], SchedulerLimits(policy=policy))
    return got_many.output_throughput / got_few.output_throughput


def test_fair_shares_tokens_equally_between_tenants_fcfs_by_requests_in_flight() -> None:
    assert rates("fcfs") == pytest.approx(3, rel=0.1)
    assert rates("priority") == pytest.approx(3, rel=0.1)
    assert rates("fair") == pytest.approx(1, rel=0.05)
    # Identical lengths end all 4 of the small tenant's requests in one step; idle for a
    # moment, it keeps its virtual time, so the share holds.
    assert rates("fair", spread=0.0) == pytest.approx(1, rel=0.05)


def test_a_tenant_that_only_waits_for_a_seat_does_not_hold_the_seated_one_still() -> None:
    seated = Workload(8, 50, None, concurrency=2, tenant="a")
    waiting = Workload(8, 4, 2, concurrency=1, tenant="b", delay_s=0.01)
    limits = SchedulerLimits(policy="fair", max_num_seqs=2)
    got_seated, got_waiting = simulate_workloads(FLAT, [seated, waiting], limits)
    # b waits for a's first answers to end (step 50: the prefill step samples the first of
    # the 50 tokens), then takes a seat in step 51; a kept decoding meanwhile.
    assert got_waiting.ttft[0] == pytest.approx(51 * 0.05 - 0.01)
    assert got_seated.output_tokens > 0 and len(got_waiting.e2e) == 2


def step(shares: TenantShares, tenant: str, tokens: int, steps: int = 1) -> None:
    """`steps` steps, each computing `tokens` for `tenant`."""
    for _ in range(steps):
        shares.charge([(SimRequest(1, 1, 0.0, tenant=tenant), tokens)])


def test_a_tenant_back_soon_keeps_its_place_back_late_at_most_a_quantum_of_credit() -> None:
    shares = TenantShares()
    shares.activate("a")  # the first: a quantum below the (zero) clock
    step(shares, "a", 1000)
    shares.activate("b")
    assert (shares.vtime("a"), shares.vtime("b")) == (
        936,
        936 - 64,
    )  # new: a quantum behind the least
    shares.release("b")
    step(shares, "a", 500)
    shares.activate("b")  # back within the grace (a client's next request): nothing forgiven
    assert shares.vtime("b") == 872
    shares.release("b")
    step(shares, "a", 10, steps=33)
    shares.activate("b")  # back after 33 idle steps: at most a quantum of credit
    assert shares.vtime("b") == 936 + 500 + 330 - 64
    shares.release("a")
    shares.release("b")
    step(shares, "b", 0, steps=40)
    shares.activate("c")  # none active: the floor of the least seen last
    assert shares.vtime("c") == 1766 - 64


def test_the_mixed_prediction_is_deterministic_and_priority_helps_the_chats() -> None:
    cost = replace(COST, request_s=0.004)  # a chat reaches the engine while a step runs
    chats = InteractiveLoad(requests=20, prompt_tokens=40, output_tokens=16)
    batch = BatchLoad(in_flight=8, prompt_tokens=2000, output_tokens=32)
    first = plan_mixed(cost, SchedulerLimits(), chats, batch)
    assert first.to_json() == plan_mixed(cost, SchedulerLimits(), chats, batch).to_json()
    fcfs, priority = first.point("fcfs"), first.point("priority")
    # fcfs: now and then a chat waits out a step prefilling a whole 2,000-token prompt (1 s);
    # priority: the batch's prefill goes 256 tokens a step, never beside a chat's.
    assert fcfs.ttft_p99 > 1.0 > 0.25 > priority.ttft_p99
    assert fcfs.idle_ttft_p99 < fcfs.ttft_p99  # the batch load costs the chats time
    assert 0 < fcfs.batch_share <= 1.05 and first.start_s > 0  # chats start after the ramp
    assert plan_mixed(cost, SchedulerLimits(), chats, batch, ["fair"]).points[0].policy == "fair"


def test_impossible_classes_and_policies_are_refused() -> None:
    with pytest.raises(PlanError, match="one of fcfs, priority, fair"):
        SchedulerLimits(policy="lifo")
    with pytest.raises(PlanError, match="0 \\(no cap\\) or more"):
        SchedulerLimits(long_prefill_token_threshold=-1)
    with pytest.raises(PlanError, match="background decode rows must be 0"):
        SchedulerLimits(background_decode_rows=-1)
    with pytest.raises(PlanError, match="background workload"):
        Workload(10, 10, None, rate=1.0)
    with pytest.raises(PlanError, match="a request count, or an end time"):
        simulate_workloads(COST, [Workload(10, 10, None, concurrency=1)], SchedulerLimits())
    with pytest.raises(PlanError, match="start delay"):
        Workload(10, 10, 1, concurrency=1, delay_s=-1)


def test_background_rows_shorten_the_chats_steps_as_the_engines_do() -> None:
    """16 batch decodes cost 10 ms each: with the engine's default 4 background rows a
    chat's decode step runs 4 of them (30 ms + 10 ms a row, its own too), without a cap
    all 16."""
    cost = replace(COST, seq_s=0.01, token_s=0.0, request_s=0.004)
    chats = InteractiveLoad(requests=10, prompt_tokens=20, output_tokens=8)
    batch = BatchLoad(in_flight=16, prompt_tokens=200, output_tokens=64)
    capped = plan_mixed(cost, SchedulerLimits(), chats, batch, ["priority"]).points[0]
    uncapped = plan_mixed(
        cost, SchedulerLimits(background_decode_rows=0), chats, batch, ["priority"]
    ).points[0]
    assert capped.tpot_p50 == pytest.approx(0.03 + 0.01 * 5)
    # (a batch seat between one answer and the next now and then)
    assert uncapped.tpot_p50 == pytest.approx(0.03 + 0.01 * 17, rel=0.05)
    assert capped.ttft_p99 < uncapped.ttft_p99
    assert capped.batch_share < uncapped.batch_share  # the batch pays for it in turns
