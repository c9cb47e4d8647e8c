"""Accuracy intervals and the paired comparison, exact where it matters, standard library only.

- Wilson score interval for a proportion (95%): sound at small n and at 0% or 100%.
- Exact McNemar test: under "no difference", each item one endpoint got right and the other
  wrong is equally likely to go either way, so the discordant count is Binomial(b + c, 1/2);
  the two-sided p-value doubles the smaller tail (capped at 1).
- Paired difference of accuracies (B − A) = (c − b) / n with its 95% Wald interval for
  paired proportions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.959963984540054


@dataclass(frozen=True, slots=True)
class Proportion:
    """k right of n, with a 95% Wilson interval."""

    k: int
    n: int
    low: float
    high: float

    @property
    def value(self) -> float:
        return self.k / self.n if self.n else 0.0


def wilson(k: int, n: int, z: float = Z95) -> Proportion:
    """``k`` of ``n`` with its Wilson score interval (0–1 when ``n`` is 0)."""
    if n == 0:
        return Proportion(0, 0, 0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return Proportion(k, n, max(0.0, centre - half), min(1.0, centre + half))


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for ``b`` and ``c`` discordant pairs."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return min(1.0, 2 * tail / 2**n)


@dataclass(frozen=True, slots=True)
class PairedDifference:
    """Accuracy of B minus accuracy of A over the same n items."""

    n: int
    a_only: int  # b: right on A, wrong on B (A → B flips right → wrong)
    b_only: int  # c: wrong on A, right on B
    diff: float
    low: float
    high: float
    p_value: float


def paired_difference(n: int, a_only: int, b_only: int, z: float = Z95) -> PairedDifference:
    """The paired difference, its 95% interval and the exact McNemar p-value."""
    if n == 0:
        return PairedDifference(0, 0, 0, 0.0, -1.0, 1.0, 1.0)
    diff = (b_only - a_only) / n
    variance = max(0.0, (a_only + b_only) - (b_only - a_only) ** 2 / n) / (n * n)
    half = z * math.sqrt(variance)
    return PairedDifference(
        n,
        a_only,
        b_only,
        diff,
        max(-1.0, diff - half),
        min(1.0, diff + half),
        mcnemar_exact(a_only, b_only),
    )
