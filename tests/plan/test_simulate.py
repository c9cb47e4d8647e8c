"""The scheduler simulation on cases whose answers are known by hand."""

from __future__ import annotations

import time

import pytest

from inhouse.plan.errors import PlanError
from inhouse.plan.latency import Traffic, plan_latency
from inhouse.plan.perf_model import StepCost, prefill_pairs
from inhouse.plan.sim_engine import SchedulerLimits
from inhouse.plan.simulate import Workload, simulate

# A step costs 20 ms + 0.5 ms a token (compute-bound past 20 tokens) + 1 ms a decode.
COST = StepCost(
    base_s=0.02, weights_s=0.01, token_s=0.0005, seq_s=0.001, context_s=0.0, pair_s=1e-9,
    request_s=0.004,
)  # fmt: skip
FLAT = StepCost(base_s=0.05, weights_s=0.0, token_s=0.0, seq_s=0.0, context_s=0.0, pair_s=0.0)


def closed(prompt: int, output: int, concurrency: int, requests: int) -> Workload:
    return Workload(prompt, output, requests, concurrency=concurrency)


def test_one_sequence_ttft_is_its_prefill_step_and_tpot_its_decode_step() -> None:
    result = simulate(COST, closed(300, 10, 1, 1), SchedulerLimits())
    assert result.ttft == [pytest.approx(COST.request_s + COST.prefill_step(300))]
    assert result.ttft[0] == pytest.approx(0.004 + 0.02 + 0.5e-3 * 300 + 1e-9 * 300 * 301 / 2)
    assert result.tpot == [pytest.approx(COST.decode_step(1, 0))]  # max(10 ms, 0.5 ms) + 1 ms
    assert result.steps == 10  # one prefill step samples the first token, nine decodes the rest


def test_a_saturated_batch_yields_batch_over_step_time() -> None:
    batch = 8
    limits = SchedulerLimits(max_num_seqs=batch)
    # Every step costs the same 50 ms whatever it holds: 8 sequences a step → 160 tok/s.
    result = simulate(FLAT, closed(16, 100, 2 * batch, 4 * batch), limits)
    assert result.output_throughput == pytest.approx(batch / 0.05)
    assert result.peak_running == batch
    assert result.tpot_p(50) == pytest.approx(0.05)
    # The second wave waits a whole first wave (100 steps) before its prefill step.
    assert result.ttft_p(99) == pytest.approx(101 * 0.05)


def test_chunked_prefill_splits_a_long_prompt_across_steps() -> None:
    limits = SchedulerLimits(max_num_batched_tokens=2048)
    result = simulate(COST, closed(5000, 2, 1, 1), limits)
    chunks = [(0, 2048), (2048, 2048), (4096, 904)]
    expected = COST.request_s + sum(
        COST.step_time(chunk, 0, 0, prefill_pairs(done, chunk)) for done, chunk in chunks
    )
    assert result.ttft[0] == pytest.approx(expected)
    assert result.steps == 3 + 1


def test_without_chunked_prefill_a_prompt_over_the_budget_is_refused() -> None:
    limits = SchedulerLimits(max_num_batched_tokens=2048, chunked_prefill=False)
    with pytest.raises(PlanError, match="never fits"):
        simulate(COST, closed(5000, 2, 1, 1), limits)


def test_decodes_go_first_and_a_prefill_takes_what_budget_is_left() -> None:
    # Two requests at once, a 100-token budget: the first prompt (80) fits whole, the
    # second gets 20 tokens in step 1; step 2 decodes the first and prefills 60 more.
    limits = SchedulerLimits(max_num_batched_tokens=100)
    result = simulate(FLAT, closed(80, 3, 2, 2), limits)
    assert sorted(result.ttft) == [pytest.approx(0.05), pytest.approx(0.10)]


def test_a_kv_cache_holding_one_request_serializes_them() -> None:
    limits = SchedulerLimits(kv_tokens=64, block_size=16)  # 4 blocks; a request needs 4
    result = simulate(FLAT, closed(32, 32, 2, 2), limits)
    assert result.peak_running == 1
    assert max(result.ttft) == pytest.approx(33 * 0.05)  # 32 steps of the first, then its own


def test_a_slow_open_loop_sees_the_lone_request_ttft() -> None:
    workload = Workload(300, 10, 20, rate=0.1, seed=3)  # ~10 s apart, each done in ~0.4 s
    result = simulate(COST, workload, SchedulerLimits())
    alone = COST.request_s + COST.prefill_step(300)
    assert result.ttft_p(99) == pytest.approx(alone)


def test_workloads_and_limits_refuse_impossible_values() -> None:
    with pytest.raises(PlanError):
        Workload(10, 10, 10)  # neither concurrency nor rate
    with pytest.raises(PlanError):
        Workload(10, 10, 10, concurrency=0)
    with pytest.raises(PlanError):
        SchedulerLimits(max_num_seqs=0)


def test_the_knee_search_agrees_with_the_curve_and_runs_fast() -> None:
    started = time.perf_counter()
    latency = plan_latency(COST, SchedulerLimits(), Traffic(256, 128), 2.0)
    assert time.perf_counter() - started < 1.0
    within = latency.max_within_slo
    assert within >= 1
    assert latency.knee is not None and latency.knee > within
    for point in latency.points:
        assert (point.ttft_p99 <= 2.0) == (point.concurrency <= within)
