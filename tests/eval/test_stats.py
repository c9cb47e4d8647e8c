"""Wilson intervals, the exact McNemar test and the paired difference against published or
hand-computed values."""

from __future__ import annotations

import math

import pytest

from inhouse.eval.stats import mcnemar_exact, paired_difference, wilson


def test_wilson_matches_the_published_interval() -> None:
    p = wilson(8, 10)  # Newcombe (1998), table I: 0.4902–0.9433
    assert p.value == 0.8
    assert p.low == pytest.approx(0.4902, abs=1e-4) and p.high == pytest.approx(0.9433, abs=1e-4)


def test_wilson_at_the_edges_stays_inside_0_1() -> None:
    none, every = wilson(0, 10), wilson(10, 10)
    assert none.low == pytest.approx(0.0) and none.high == pytest.approx(0.2775, abs=1e-4)
    assert every.high == pytest.approx(1.0) and every.low == pytest.approx(0.7225, abs=1e-4)
    assert (wilson(0, 0).low, wilson(0, 0).high) == (0.0, 1.0)


@pytest.mark.parametrize(
    ("b", "c", "p"),
    [
        (1, 9, 22 / 1024),  # 2 * (C(10,0) + C(10,1)) / 2**10
        (9, 1, 22 / 1024),
        (0, 5, 2 / 32),
        (10, 0, 2 / 1024),
        (3, 3, 1.0),
        (0, 0, 1.0),
    ],
)
def test_mcnemar_exact(b: int, c: int, p: float) -> None:
    assert mcnemar_exact(b, c) == pytest.approx(p)


def test_mcnemar_agrees_with_a_direct_binomial_sum_on_larger_counts() -> None:
    b, c = 14, 30
    n = b + c
    direct = 2 * sum(math.comb(n, i) * 0.5**n for i in range(b + 1))
    assert mcnemar_exact(b, c) == pytest.approx(direct) and mcnemar_exact(b, c) < 0.05


def test_paired_difference() -> None:
    d = paired_difference(100, a_only=10, b_only=2)
    assert d.diff == pytest.approx(-0.08)
    half = 1.959964 * math.sqrt(12 - 8**2 / 100) / 100
    assert (d.low, d.high) == (pytest.approx(-0.08 - half), pytest.approx(-0.08 + half))
    assert d.p_value == pytest.approx(mcnemar_exact(10, 2))
    same = paired_difference(50, 0, 0)
    assert (same.diff, same.low, same.high, same.p_value) == (0.0, 0.0, 0.0, 1.0)
