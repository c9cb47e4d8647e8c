"""Speculative decoding in the plan: the simulated step, the profile field, `inhouse plan`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from inhouse.launch.plan_command import EXIT_BAD_INPUT, plan
from inhouse.plan.errors import PlanError
from inhouse.plan.perf_model import Profile, StepCost, profile_from_json, read_profile
from inhouse.plan.sim_engine import SchedulerLimits
from inhouse.plan.simulate import Workload, simulate
from inhouse.plan.speculation import Speculation, measured_speculation

# 20 ms + max(10 ms, 0.5 ms a row) + 1 ms a decode row; attention free.
COST = StepCost(
    base_s=0.02, weights_s=0.01, token_s=0.0005, seq_s=0.001, context_s=0.0, pair_s=0.0,
    source="calibrated: test",
)  # fmt: skip
SPEC = Speculation(
    num_speculative_tokens=4, disable_by_batch_size=1, acceptance_rate=0.375,
    mean_accepted_length=2.5, requests=8,
)  # fmt: skip


def alone(output: int, speculation: Speculation | None, concurrency: int = 1):
    workload = Workload(16, output, concurrency, concurrency=concurrency)
    return simulate(COST, workload, SchedulerLimits(speculation=speculation))


def test_speculation_at_one_sequence_divides_tpot_by_the_hand_computed_factor() -> None:
    plain, spec = alone(11, None), alone(11, SPEC)
    assert plain.tpot == [pytest.approx(0.02 + 0.01 + 0.001)]
    # A verified step: 5 rows (max(10 ms, 2.5 ms) + 5 × 1 ms) = 35 ms. Ten tokens after the
    # first at 2.5 a step, credit carried: 2 + 3 + 2 + 3 = 10 in four steps.
    assert spec.tpot == [pytest.approx(4 * 0.035 / 10)]
    assert spec.steps == 1 + 4 and plain.steps == 1 + 10
    assert spec.tpot[0] / plain.tpot[0] == pytest.approx(0.035 / 0.031 / 2.5)
    assert spec.ttft == plain.ttft  # the prefill step does not draft


def test_a_measured_draft_length_sets_the_verify_rows() -> None:
    # The engine's adaptive length drafted 2 tokens a draft on average, not K = 4: a verified
    # step is 3 rows (20 ms + max(10 ms, 1.5 ms) + 3 x 1 ms) = 33 ms instead of 35 ms. Ten
    # tokens after the first at 2.25 a step: five steps either way.
    short = Speculation(4, 1, 0.625, 2.25, mean_draft_length=2.0)
    assert short.rows_per_draft == 2
    assert alone(11, short).tpot == [pytest.approx(5 * 0.033 / 10)]
    assert alone(11, Speculation(4, 1, 0.625, 2.25)).tpot == [pytest.approx(5 * 0.035 / 10)]


def test_above_the_gate_decodes_are_plain() -> None:
    plain, spec = alone(40, None, concurrency=2), alone(40, SPEC, concurrency=2)
    assert spec.tpot == plain.tpot and spec.ttft == plain.ttft and spec.steps == plain.steps


def test_no_gate_drafts_at_any_batch() -> None:
    always = Speculation(4, None, 0.375, 2.5)
    plain, spec = alone(41, None, concurrency=8), alone(41, always, concurrency=8)
    assert spec.steps < plain.steps


def test_the_last_step_never_generates_past_max_tokens() -> None:
    generous = Speculation(4, 4, 1.0, 5.0)
    result = alone(7, generous)
    assert result.output_tokens == 7
    assert result.steps == 1 + 2  # 5 tokens, then the 1 left


def test_a_fractional_length_simulates_the_same_twice() -> None:
    odd = Speculation(3, 4, 0.23, 1.7)
    first, second = alone(200, odd, concurrency=3), alone(200, odd, concurrency=3)
    assert first == second
    assert first.output_tokens == 3 * 200


def test_profile_with_speculation_round_trips(tmp_path: Path) -> None:
    profile = Profile(COST, "m", 64, 2048, {"seconds": 1.0}, SPEC)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile.to_json()))
    assert read_profile(path) == profile
    assert json.loads(path.read_text())["speculation"]["mean_accepted_length"] == 2.5


def test_a_profile_written_before_speculation_still_loads() -> None:
    document = Profile(COST, "m", 64, 2048, {}).to_json()
    del document["speculation"]
    assert profile_from_json(document).speculation is None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("acceptance_rate", 1.5, "acceptance rate must be a number in"),
        ("acceptance_rate", "high", "acceptance rate must be a number in"),
        ("mean_accepted_length", 0.5, "mean accepted length must be a number in"),
        ("mean_accepted_length", 6.0, "mean accepted length must be a number in"),
        ("num_speculative_tokens", 0, "num_speculative_tokens must be an integer"),
        ("disable_by_batch_size", 0, "disable_by_batch_size must be an integer"),
        ("requests", -1, "request count must be"),
    ],
)
def test_a_bad_speculation_field_is_one_clear_error(field: str, value: object, message: str):
    document = Profile(COST, "m", 64, 2048, {}, SPEC).to_json()
    document["speculation"][field] = value
    with pytest.raises(PlanError, match=message):
        profile_from_json(document)


def test_a_speculation_that_is_not_an_object_is_refused() -> None:
    document = Profile(COST, "m", 64, 2048, {}).to_json()
    document["speculation"] = [4, 2.5]
    with pytest.raises(PlanError, match="speculation must be an object"):
        profile_from_json(document)


def test_acceptance_from_counters_gives_the_mean_draft_length() -> None:
    spec = measured_speculation(8, 4, drafts=10, draft_tokens=25, accepted=15, requests=3)
    assert spec.mean_draft_length == 2.5 and spec.rows_per_draft == 2
    with pytest.raises(PlanError, match="mean draft length"):
        Speculation(4, 4, 0.5, 2.0, mean_draft_length=5.0)


def test_acceptance_from_counters_is_vllms_rate_and_mean_length() -> None:
    measured = measured_speculation(4, 4, drafts=10, draft_tokens=40, accepted=15, requests=3)
    assert (measured.acceptance_rate, measured.mean_accepted_length) == (0.375, 2.5)
    with pytest.raises(PlanError, match="drafted nothing"):
        measured_speculation(4, 4, drafts=0, draft_tokens=0, accepted=0, requests=3)


def run_plan(*args: str):
    app = typer.Typer()
    app.command()(plan)
    return CliRunner().invoke(app, list(args))


def test_plan_with_a_speculating_profile_says_its_acceptance(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(Profile(COST, "m", 16, 2048, {}, SPEC).to_json()))
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(Profile(COST, "m", 16, 2048, {}).to_json()))
    args = ("smollm2", "--cpu", "--steps", "1,4", "--output-tokens", "64")
    with_spec = run_plan(*args, "--profile", str(path), "--json")
    without = run_plan(*args, "--profile", str(plain), "--json")
    assert with_spec.exit_code == 0 and without.exit_code == 0, with_spec.output + without.output
    latency = json.loads(with_spec.stdout)["latency"]
    assert latency["scheduler"]["speculation"] == SPEC.to_json()
    assert json.loads(without.stdout)["latency"]["scheduler"]["speculation"] is None
    spec_curve = {p["concurrency"]: p["tpot_p50"] for p in latency["curve"]}
    plain_curve = {
        p["concurrency"]: p["tpot_p50"] for p in json.loads(without.stdout)["latency"]["curve"]
    }
    assert spec_curve[1] < 0.6 * plain_curve[1]
    assert spec_curve[4] == pytest.approx(plain_curve[4])  # above the gate of 1
    human = run_plan(*args, "--profile", str(path))
    assert "acceptance 38%, mean accepted length 2.50" in human.stdout


def test_plan_refuses_a_profile_with_a_bad_acceptance(tmp_path: Path) -> None:
    document = Profile(COST, "m", 16, 2048, {}, SPEC).to_json()
    document["speculation"]["acceptance_rate"] = -0.1
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(document))
    result = run_plan("smollm2", "--cpu", "--profile", str(path))
    assert result.exit_code == EXIT_BAD_INPUT
    assert "acceptance rate must be a number in [0, 1]" in result.stderr
