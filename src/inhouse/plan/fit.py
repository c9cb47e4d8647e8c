"""Fit a `StepCost` to calibration probes: non-negative least squares, in pure Python.

Prefill probes (one request alone, prompt P, its TTFT) fix the per-token and
attention-pair costs:  ttft = intercept + token_s · P + pair_s · P(P+1)/2.
Decode probes (B requests together, each attending over L tokens, the median gap
between tokens) fix the rest:  step = base + max(weights_s, token_s · B) + seq_s · B
+ context_s · B · L, with weights_s found by a search over its range. The prefill
intercept less ``base_s`` is the per-request cost outside the engine (HTTP, template).

``context_s`` is held at or above ``pair_s``: a decode attends over each context token as
one (query, key) pair, which costs at least what a prefill pays a pair. Short probes hardly
see a decode's attention (one 1,024-token sequence adds a few ms to a step), so on a noisy
host the fit alone can put it at zero, and then 16 long sequences decoding together are
predicted twice as fast as they run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inhouse.plan.errors import PlanError
from inhouse.plan.perf_model import StepCost, prefill_pairs

WEIGHTS_GRID = 40


@dataclass(frozen=True, slots=True)
class PrefillPoint:
    """One prompt of `prompt` tokens sent alone; `ttft` seconds to its first token."""

    prompt: int
    ttft: float


@dataclass(frozen=True, slots=True)
class DecodePoint:
    """`batch` sequences decoding together, each over ~`context` tokens; `step` seconds a token."""

    batch: int
    context: int
    step: float


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when the system is singular."""
    n = len(vector)
    a = [[*row, vector[i]] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-300:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                factor = a[r][col] / a[col][col]
                a[r] = [x - factor * y for x, y in zip(a[r], a[col], strict=True)]
    return [a[i][n] / a[i][i] for i in range(n)]


def nonnegative_least_squares(rows: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """min ‖rows·x − ys‖ with x ≥ 0, by dropping the most negative coefficient until none is.

    Columns are scaled to unit size first, so seconds-per-token and seconds-per-pair
    coefficients many orders apart solve stably.
    """
    width = len(rows[0])
    scale = [max(abs(row[j]) for row in rows) or 1.0 for j in range(width)]
    scaled = [[row[j] / scale[j] for j in range(width)] for row in rows]
    free = list(range(width))
    while free:
        normal = [[sum(r[i] * r[j] for r in scaled) for j in free] for i in free]
        moment = [sum(r[i] * y for r, y in zip(scaled, ys, strict=True)) for i in free]
        solution = _solve(normal, moment)
        if solution is None:
            free.pop()
            continue
        worst = min(range(len(free)), key=lambda k: solution[k])
        if solution[worst] >= 0:
            x = [0.0] * width
            for k, j in enumerate(free):
                x[j] = solution[k] / scale[j]
            return x
        free.pop(worst)
    return [0.0] * width


def _sse(rows: Sequence[Sequence[float]], ys: Sequence[float], x: Sequence[float]) -> float:
    return sum(
        (sum(a * b for a, b in zip(row, x, strict=True)) - y) ** 2
        for row, y in zip(rows, ys, strict=True)
    )


def fit_step_cost(
    prefill: Sequence[PrefillPoint], decode: Sequence[DecodePoint], source: str = "calibrated"
) -> StepCost:
    """The step cost that best explains the probes (needs ≥ 2 prefill and ≥ 2 decode points)."""
    if len({p.prompt for p in prefill}) < 2 or len({d.batch for d in decode}) < 2:
        raise PlanError("a fit needs prefill probes of 2+ lengths and decode probes of 2+ batches")
    prefill_rows = [[1.0, p.prompt, prefill_pairs(0, p.prompt)] for p in prefill]
    intercept, token_s, pair_s = nonnegative_least_squares(prefill_rows, [p.ttft for p in prefill])
    decode_rows = [[1.0, d.batch, d.batch * d.context] for d in decode]

    def fit_decode(weights_s: float) -> tuple[float, float, list[float]]:
        # context_s = pair_s + a non-negative rest, fitted on what pair_s leaves unexplained.
        ys = [
            d.step - max(weights_s, token_s * d.batch) - pair_s * d.batch * d.context
            for d in decode
        ]
        x = nonnegative_least_squares(decode_rows, ys)
        return _sse(decode_rows, ys, x), weights_s, [x[0], x[1], x[2] + pair_s]

    floor = min(d.step for d in decode)
    coarse = min(
        (fit_decode(floor * i / WEIGHTS_GRID) for i in range(WEIGHTS_GRID + 1)),
        key=lambda fit: fit[0],
    )
    width = floor / WEIGHTS_GRID
    fine = (
        max(coarse[1] + width * (i / WEIGHTS_GRID - 1), 0.0) for i in range(2 * WEIGHTS_GRID + 1)
    )
    _, weights_s, (base_s, seq_s, context_s) = min(
        [coarse, *(fit_decode(w) for w in fine)], key=lambda fit: fit[0]
    )
    return StepCost(
        base_s=base_s,
        weights_s=weights_s,
        token_s=token_s,
        seq_s=seq_s,
        context_s=context_s,
        pair_s=pair_s,
        request_s=max(intercept - base_s, 0.0),
        source=source,
    )
