"""A release's live figures, read from the audit log and the shadow pairs: requests, error
rate with its 95 % Wilson interval, TTFT and latency percentiles, output length, and the
answer checks (refusals, JSON-schema and tool-call validity: `answer_checks`); and for the
shadow pairs, agreement with the primary and the paired comparisons of failures and of each
check (exact McNemar), with the statistics `inhouse eval` uses."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import ColumnElement, Engine, and_, or_, select

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
    json_valid: Proportion  # answers to json_schema requests valid for their schema
    refusals: Proportion  # answers checked (200s) that refuse
    tool_calls_valid: Proportion  # answers that called tools, every call valid
    latency_ms: Percentiles
    ttft_ms: Percentiles
    mean_output_tokens: float | None


@dataclass(frozen=True, slots=True)
class PairedCheck:
    """One yes/no answer check on the shadow pairs: each side's rate over its answers that
    have the bit, and the candidate's minus the stable's over the pairs where both have it
    (a_only: only the stable's answer had it), with its interval and exact McNemar p."""

    primary: Proportion
    shadow: Proportion
    paired: PairedDifference


@dataclass(frozen=True, slots=True)
class ShadowFigures:
    """The shadow pairs of a candidate: how often it agreed with the primary, and how its
    failures compare on the same requests."""

    release: int
    pairs: int
    agreement: Proportion  # identical answers, of the pairs where both answered
    primary_errors: Proportion  # pairs whose primary failed (status >= 500)
    shadow_errors: Proportion  # pairs whose shadow failed (any status but 200)
    errors: PairedDifference  # primary failed only (a_only) vs shadow failed only (b_only)
    json_valid: PairedCheck  # json_schema requests
    refusals: PairedCheck
    tool_calls_valid: PairedCheck  # requests with tools, answers that called one
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


def released_as(name: str) -> ColumnElement[bool]:
    """The audit rows of the releases kept under `name`: a LoRA adapter's requests, or
    else the model's own (not its adapters'; names of models and adapters never clash)."""
    c = audit_log.c
    return or_(c.adapter == name, and_(c.model == name, c.adapter.is_(None)))


def live_figures(db: Engine, model: str, release: int, since: float) -> LiveFigures:
    """The release's requests answered since `since` (newest `MAX_ROWS`); `model` may
    name an adapter."""
    c = audit_log.c
    query = (
        select(
            c.status,
            c.latency_ms,
            c.ttft_ms,
            c.completion_tokens,
            c.json_valid,
            c.refusal,
            c.tool_calls_valid,
        )
        .where(released_as(model), c.release == release, c.ts >= since)
        .order_by(c.id.desc())
        .limit(MAX_ROWS)
    )
    with db.connect() as conn:
        rows = conn.execute(query).all()
    errors = sum(1 for r in rows if r.status >= 500)
    answered = [r for r in rows if r.status < 400]
    return LiveFigures(
        release=release,
        requests=len(rows),
        errors=wilson(errors, len(rows)),
        json_valid=share([r.json_valid for r in rows]),
        refusals=share([r.refusal for r in rows]),
        tool_calls_valid=share([r.tool_calls_valid for r in rows]),
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
    both = [r for r in rows if r.primary_status == 200 and r.shadow_status == 200]
    return ShadowFigures(
        release=release,
        pairs=len(rows),
        agreement=wilson(sum(1 for r in compared if r.exact_match), len(compared)),
        primary_errors=wilson(len(primary_failed), len(rows)),
        shadow_errors=wilson(len(shadow_failed), len(rows)),
        errors=paired_difference(
            len(rows), len(primary_failed - shadow_failed), len(shadow_failed - primary_failed)
        ),
        json_valid=paired_check([(r.primary_json_valid, r.shadow_json_valid) for r in rows]),
        refusals=paired_check([(r.primary_refusal, r.shadow_refusal) for r in rows]),
        tool_calls_valid=paired_check(
            [(r.primary_tool_calls_valid, r.shadow_tool_calls_valid) for r in rows]
        ),
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


def share(bits: Sequence[bool | None]) -> Proportion:
    """The share of True among the bits that are not None, with its Wilson interval."""
    known = [b for b in bits if b is not None]
    return wilson(sum(known), len(known))


def paired_check(bits: Sequence[tuple[bool | None, bool | None]]) -> PairedCheck:
    """Each side's rate and the paired difference (shadow minus primary) of one check."""
    both = [(a, b) for a, b in bits if a is not None and b is not None]
    a_only = sum(1 for a, b in both if a and not b)
    b_only = sum(1 for a, b in both if b and not a)
    return PairedCheck(
        share([a for a, _ in bits]),
        share([b for _, b in bits]),
        paired_difference(len(both), a_only, b_only),
    )


def as_json(figures: Any) -> dict[str, Any]:
    """The figures as plain JSON values (each proportion with its `value`)."""
    return _with_values(asdict(figures))


def _with_values(out: dict[str, Any]) -> dict[str, Any]:
    for value in out.values():
        if isinstance(value, dict):
            _with_values(value)
    if "k" in out and "n" in out:
        out["value"] = out["k"] / out["n"] if out["n"] else None
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
