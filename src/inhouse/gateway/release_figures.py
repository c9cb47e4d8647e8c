"""A release's live figures, read from the audit log and the shadow pairs: requests, error
rate with its 95 % Wilson interval, TTFT and latency percentiles, output length; and for the
shadow pairs, agreement with the primary and the paired error comparison (exact McNemar),
with the statistics `inhouse eval` uses."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Engine, select

from inhouse.eval.stats import PairedDifference, Proportion, paired_difference, wilson
from inhouse.gateway.db import audit_log, shadow_pairs

MAX_ROWS = 50_000  # the newest rows a figure is computed over


@dataclass(frozen=True, slots=True)
class Percentiles:
    n: int
    p50: float | None
    p99: float | None


@dataclass(frozen=True, slots=True)
class LiveFigures:
    """One release's answered requests since `since`."""

    release: int
    requests: int
    errors: Proportion  # answers with status >= 500
    json_valid: Proportion  # answers to json_schema requests that parse as JSON
    latency_ms: Percentiles
    ttft_ms: Percentiles
    mean_output_tokens: float | None


@dataclass(frozen=True, slots=True)
class ShadowFigures:
    """The shadow pairs of a candidate: how often it agreed with the primary, and how its
    failures compare on the same requests."""

    release: int
    pairs: int
    agreement: Proportion  # identical answers, of the pairs where both answered
    shadow_errors: Proportion  # pairs whose shadow failed (any status but 200)
    errors: PairedDifference  # primary failed only (a_only) vs shadow failed only (b_only)
    json_valid: Proportion  # of pairs asking for json_schema
    primary_ttft_ms: Percentiles
    shadow_ttft_ms: Percentiles
    primary_latency_ms: Percentiles
    shadow_latency_ms: Percentiles
    primary_tpot_ms: Percentiles  # (latency - TTFT) / (tokens - 1), streams of 2+ tokens
    shadow_tpot_ms: Percentiles
    primary_tokens: float | None
    shadow_tokens: float | None


def percentiles(values: list[float]) -> Percentiles:
    """p50 and p99 (nearest rank) of the values."""
    if not values:
        return Percentiles(0, None, None)
    ordered = sorted(values)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

    return Percentiles(len(ordered), rank(0.50), rank(0.99))


def live_figures(db: Engine, model: str, release: int, since: float) -> LiveFigures:
    """The release's requests answered since `since` (newest `MAX_ROWS`)."""
    c = audit_log.c
    query = (
        select(c.status, c.latency_ms, c.ttft_ms, c.completion_tokens, c.json_valid)
        .where(c.model == model, c.release == release, c.ts >= since)
        .order_by(c.id.desc())
        .limit(MAX_ROWS)
    )
    with db.connect() as conn:
        rows = conn.execute(query).all()
    errors = sum(1 for r in rows if r.status >= 500)
    answered = [r for r in rows if r.status < 400]
    checked = [r for r in rows if r.json_valid is not None]
    return LiveFigures(
        release=release,
        requests=len(rows),
        errors=wilson(errors, len(rows)),
        json_valid=wilson(sum(1 for r in checked if r.json_valid), len(checked)),
        latency_ms=percentiles([r.latency_ms for r in answered if r.latency_ms is not None]),
        ttft_ms=percentiles([r.ttft_ms for r in answered if r.ttft_ms is not None]),
        mean_output_tokens=_mean([r.completion_tokens for r in answered]),
    )


def shadow_figures(db: Engine, model: str, release: int, since: float) -> ShadowFigures:
    """The candidate's shadow pairs since `since` (newest `MAX_ROWS`)."""
    c = shadow_pairs.c
    query = (
        select(shadow_pairs)
        .where(c.model == model, c.shadow_release == release, c.ts >= since)
        .order_by(c.id.desc())
        .limit(MAX_ROWS)
    )
    with db.connect() as conn:
        rows = conn.execute(query).all()
    compared = [r for r in rows if r.exact_match is not None]
    primary_failed = {i for i, r in enumerate(rows) if r.primary_status >= 500}
    shadow_failed = {i for i, r in enumerate(rows) if r.shadow_status != 200}
    json_rows = [r for r in rows if r.shadow_json_valid is not None]
    both = [r for r in rows if r.primary_status == 200 and r.shadow_status == 200]
    return ShadowFigures(
        release=release,
        pairs=len(rows),
        agreement=wilson(sum(1 for r in compared if r.exact_match), len(compared)),
        shadow_errors=wilson(len(shadow_failed), len(rows)),
        errors=paired_difference(
            len(rows), len(primary_failed - shadow_failed), len(shadow_failed - primary_failed)
        ),
        json_valid=wilson(sum(1 for r in json_rows if r.shadow_json_valid), len(json_rows)),
        primary_ttft_ms=percentiles([r.primary_ttft_ms for r in both if r.primary_ttft_ms]),
        shadow_ttft_ms=percentiles([r.shadow_ttft_ms for r in both if r.shadow_ttft_ms]),
        primary_latency_ms=percentiles([r.primary_latency_ms for r in both]),
        shadow_latency_ms=percentiles([r.shadow_latency_ms for r in both if r.shadow_latency_ms]),
        primary_tpot_ms=percentiles(
            _tpots((r.primary_latency_ms, r.primary_ttft_ms, r.primary_tokens) for r in both)
        ),
        shadow_tpot_ms=percentiles(
            _tpots((r.shadow_latency_ms, r.shadow_ttft_ms, r.shadow_tokens) for r in both)
        ),
        primary_tokens=_mean([r.primary_tokens for r in both if r.primary_tokens is not None]),
        shadow_tokens=_mean([r.shadow_tokens for r in both if r.shadow_tokens is not None]),
    )


def as_json(figures: LiveFigures | ShadowFigures) -> dict[str, Any]:
    """The figures as plain JSON values (intervals as their bounds)."""
    out = asdict(figures)
    for value in out.values():
        if isinstance(value, dict) and "k" in value and "n" in value:
            value["value"] = value["k"] / value["n"] if value["n"] else None
    return out


def _tpots(rows: Iterable[tuple[float | None, float | None, int | None]]) -> list[float]:
    """Time per output token after the first, of each answer that has it."""
    return [
        (latency - ttft) / (tokens - 1)
        for latency, ttft, tokens in rows
        if latency is not None and ttft is not None and tokens is not None and tokens > 1
    ]


def _mean(values: list[int] | list[float]) -> float | None:
    return sum(values) / len(values) if values else None
