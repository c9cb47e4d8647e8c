"""From per-item results to the numbers a team decides on: accuracy per grader and per tag
with intervals, latency and tokens, and the paired comparison of two endpoints with its flips."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from inhouse.eval.client import Endpoint, ItemResult
from inhouse.eval.items import EvalItem
from inhouse.eval.stats import PairedDifference, Proportion, paired_difference, wilson


@dataclass(frozen=True, slots=True)
class EndpointSummary:
    """One endpoint's accuracy (errors count as wrong), errors, latency and tokens per item."""

    endpoint: Endpoint
    overall: Proportion
    by_grader: dict[str, Proportion]
    by_tag: dict[str, Proportion]
    errors: int
    latency_p50_s: float | None
    latency_mean_s: float | None
    prompt_tokens_mean: float | None
    completion_tokens_mean: float | None


@dataclass(frozen=True, slots=True)
class Comparison:
    """B against A on the same items: the paired difference and which items flipped."""

    paired: PairedDifference
    right_to_wrong: list[str]  # right on A, wrong on B
    wrong_to_right: list[str]


def _grouped(
    items: list[EvalItem],
    results: list[ItemResult],
    keys: Callable[[EvalItem], Iterable[str]],
) -> dict[str, Proportion]:
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for item, result in zip(items, results, strict=True):
        for key in keys(item):
            counts[key][0] += result.correct
            counts[key][1] += 1
    return {key: wilson(k, n) for key, (k, n) in sorted(counts.items())}


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarize(
    endpoint: Endpoint, items: list[EvalItem], results: list[ItemResult]
) -> EndpointSummary:
    """Accuracy with 95% Wilson intervals overall, per grader and per tag, and the costs."""
    latencies = [r.latency_s for r in results if r.latency_s is not None]
    return EndpointSummary(
        endpoint=endpoint,
        overall=wilson(sum(r.correct for r in results), len(results)),
        by_grader=_grouped(items, results, lambda item: [item.grader]),
        by_tag=_grouped(items, results, lambda item: item.tags),
        errors=sum(r.error is not None for r in results),
        latency_p50_s=statistics.median(latencies) if latencies else None,
        latency_mean_s=_mean(latencies),
        prompt_tokens_mean=_mean([r.prompt_tokens for r in results if r.prompt_tokens is not None]),
        completion_tokens_mean=_mean(
            [r.completion_tokens for r in results if r.completion_tokens is not None]
        ),
    )


def compare(a: list[ItemResult], b: list[ItemResult]) -> Comparison:
    """The paired comparison of two endpoints' results on the same items (same order)."""
    right_to_wrong = [x.id for x, y in zip(a, b, strict=True) if x.correct and not y.correct]
    wrong_to_right = [x.id for x, y in zip(a, b, strict=True) if y.correct and not x.correct]
    return Comparison(
        paired_difference(len(a), len(right_to_wrong), len(wrong_to_right)),
        right_to_wrong,
        wrong_to_right,
    )
