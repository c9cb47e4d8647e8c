import pytest

from inhouse.bench.sweep import (
    concurrency_steps,
    find_knee,
    judge,
    parse_steps,
    prompts_for_step,
)


def test_steps_double_to_at_least_twice_the_prediction() -> None:
    assert concurrency_steps(14) == [1, 2, 4, 8, 16, 32]
    assert concurrency_steps(16) == [1, 2, 4, 8, 16, 32]
    assert concurrency_steps(3, at_least=20) == [1, 2, 4, 8, 16, 32]
    assert concurrency_steps() == [1, 2, 4, 8, 16]


def test_parse_steps() -> None:
    assert parse_steps("8, 1,2,2") == [1, 2, 8]
    for bad in ("", "0,1", "a,b"):
        with pytest.raises(ValueError):
            parse_steps(bad)


def test_knee_is_lowest_step_over_the_slo() -> None:
    p99 = [(1, 0.1), (2, 0.2), (4, 0.9), (8, 0.4), (16, 3.0)]
    assert find_knee(p99, slo_ttft=0.5) == 4
    assert find_knee(p99, slo_ttft=5.0) is None
    assert find_knee([(1, 0.1), (2, None)], slo_ttft=1.0) == 2  # nothing succeeded: over


def test_verdict_says_how_far_the_knee_is_from_the_plan() -> None:
    verdict = judge([1, 2, 4, 8, 16, 32], knee=8, predicted=14)
    assert verdict.last_within_slo == 4
    assert verdict.ratio == pytest.approx(8 / 14)
    assert "0.57×" in verdict.sentence and "below" in verdict.sentence
    never = judge([1, 2, 4], knee=None, predicted=2)
    assert never.last_within_slo == 4 and never.ratio is None
    assert "at least 2.00×" in never.sentence
    assert "no plan" in judge([1, 2], knee=1, predicted=None).sentence


def test_prompts_per_step() -> None:
    assert prompts_for_step(1, 4, 8) == 8
    assert prompts_for_step(16, 4, 8) == 64
