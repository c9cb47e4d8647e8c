"""The step-time model: the roofline against published vLLM figures, the fit, the profile file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inhouse.plan.errors import PlanError
from inhouse.plan.fit import DecodePoint, PrefillPoint, fit_step_cost, nonnegative_least_squares
from inhouse.plan.gpus import find_gpu
from inhouse.plan.perf_model import Profile, StepCost, profile_from_json, read_profile
from inhouse.plan.planner import PlanInputs, make_plan
from inhouse.plan.source import load_model
from inhouse.plan.step_costs import gpu_hardware, plan_roofline_cost

KNOWN = StepCost(
    base_s=0.015, weights_s=0.01, token_s=0.0004, seq_s=0.0015, context_s=2e-6, pair_s=3e-10,
    request_s=0.006,
)  # fmt: skip


def llama8b_on(gpu: str):
    plan = make_plan(
        load_model("llama-3.1-8b"), PlanInputs(gpu=gpu, weights="bf16", avg_context=4000)
    )
    return plan, plan_roofline_cost(plan, gpu_hardware(find_gpu(gpu)))


def test_roofline_decode_at_batch_1_is_vllms_75_tokens_per_s_on_an_a100_40g() -> None:
    _, cost = llama8b_on("A100-40G")
    tokens_per_s = 1 / cost.decode_step(1, 1000)
    assert tokens_per_s == pytest.approx(75, rel=0.05)


def test_roofline_batch_of_14_reads_their_kv_on_top_of_the_weights() -> None:
    plan, cost = llama8b_on("A100-80G")
    one, fourteen = cost.decode_step(1, 4000), cost.decode_step(14, 4000)
    # Still memory-bound at 14: the step reads the weights once, plus 13 more sequences' KV.
    kv_read = 13 * 4000 * plan.kv_bytes_per_token / (2.039e12 * 0.77)
    assert fourteen - one == pytest.approx(kv_read + 13 * cost.seq_s)


def test_fit_recovers_the_coefficients_that_made_the_points() -> None:
    prefill = [PrefillPoint(p, KNOWN.request_s + KNOWN.prefill_step(p)) for p in (128, 512, 1536)]
    decode = [DecodePoint(b, 150, KNOWN.decode_step(b, 150)) for b in (1, 2, 4, 8, 16, 32)]
    decode += [DecodePoint(b, 1040, KNOWN.decode_step(b, 1040)) for b in (1, 4)]
    fitted = fit_step_cost(prefill, decode)
    for batch, context in ((1, 200), (8, 300), (24, 700)):
        assert fitted.decode_step(batch, context) == pytest.approx(
            KNOWN.decode_step(batch, context), rel=0.02
        )
    assert fitted.prefill_step(1024) == pytest.approx(KNOWN.prefill_step(1024), rel=0.02)
    assert fitted.token_s == pytest.approx(KNOWN.token_s, rel=1e-6)
    assert fitted.request_s == pytest.approx(KNOWN.request_s, abs=0.001)


def test_fit_needs_two_lengths_and_two_batches() -> None:
    with pytest.raises(PlanError, match="2\\+"):
        fit_step_cost([PrefillPoint(128, 0.1)], [DecodePoint(1, 100, 0.02)])


def test_nonnegative_least_squares_drops_a_negative_coefficient() -> None:
    rows = [[1.0, x] for x in (1.0, 2.0, 3.0)]
    assert nonnegative_least_squares(rows, [3.0, 2.0, 1.0]) == [pytest.approx(2.0), 0.0]


def test_profile_round_trips_through_its_file(tmp_path: Path) -> None:
    profile = Profile(KNOWN, "m", 64, 2048, {"seconds": 1.0})
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile.to_json()))
    assert read_profile(path) == profile


@pytest.mark.parametrize(
    "document",
    [{}, {"kind": "something-else"}, {"kind": "inhouse-step-profile", "model": "m"}],
)
def test_a_wrong_profile_is_one_clear_error(document: dict) -> None:
    with pytest.raises(PlanError, match="profile"):
        profile_from_json(document)


def test_negative_coefficients_are_refused() -> None:
    with pytest.raises(PlanError, match="seq_s"):
        StepCost(base_s=0, weights_s=0, token_s=0, seq_s=-1, context_s=0, pair_s=0)


def test_a_decode_pays_at_least_a_prefill_pair_per_context_token() -> None:
    # Decode probes that show no context cost at all (noise hid it), prefill that shows pairs.
    paired = StepCost(base_s=0.05, weights_s=0.0, token_s=0.002, seq_s=0.001, context_s=0.0,
                      pair_s=5e-6, request_s=0.1)  # fmt: skip
    prefill = [PrefillPoint(p, paired.request_s + paired.prefill_step(p)) for p in (64, 512, 1024)]
    decode = [DecodePoint(b, 76, paired.decode_step(b, 76) - 5e-6 * b * 76) for b in (1, 4, 16)]
    decode.append(DecodePoint(1, 1036, paired.decode_step(1, 1036)))
    fitted = fit_step_cost(prefill, decode)
    assert fitted.pair_s == pytest.approx(5e-6, rel=1e-3)
    assert fitted.context_s == pytest.approx(fitted.pair_s)
