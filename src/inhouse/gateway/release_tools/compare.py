"""What `inhouse release compare MODEL` reports: the candidate against the stable release on
the shadow pairs (the same requests, answered by both: agreement, failures, refusals,
JSON-schema and tool-call validity, paired with exact McNemar tests; timings; optionally the
answers graded with an eval set) and on the canary's live figures; as text, JSON and a PNG."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from inhouse.gateway.db import shadow_pairs
from inhouse.gateway.release_tools.grade import Grading
from inhouse.gateway.release_tools.plot import plot_compare
from inhouse.gateway.releases.figures import as_json, live_figures, shadow_figures
from inhouse.gateway.releases.store import ReleaseError, ReleaseStore

CHECKS = (
    ("refusals", "refusals"),
    ("json_valid", "valid JSON (json_schema requests)"),
    ("tool_calls_valid", "valid tool calls (answers that call a tool)"),
)


def compare(
    store: ReleaseStore, model: str, release: int | None, png: Path,
    grader: Callable[[int], Grading] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The comparison of `release` (default: the candidate, else the last one shadowed) with
    the stable release, as JSON values; the PNG is written to `png`. `grader` grades the
    release's stored pairs (`grade`)."""
    state = store.state(model)
    number = release or (state.candidate if state else None) or _last_shadowed(store, model)
    if state is None or number is None:
        raise ReleaseError(f"{model!r} has no candidate and no shadow pairs")
    pairs = shadow_figures(store.db, model, number, 0.0)
    stable = live_figures(store.db, model, state.stable, state.since)
    candidate = live_figures(store.db, model, number, state.since)
    grading = None if grader is None else grader(number)
    plot_compare(model, state.stable, pairs, (stable, candidate), grading, png)
    report = {"model": model, "candidate": number, "stable": state.stable, "png": str(png),
              "shadow": as_json(pairs), "live": {"stable": as_json(stable),
                                                 "candidate": as_json(candidate)}}  # fmt: skip
    if grading is not None:
        report["graded"] = as_json(grading)
    return report


def _last_shadowed(store: ReleaseStore, model: str) -> int | None:
    query = select(func.max(shadow_pairs.c.shadow_release)).where(shadow_pairs.c.model == model)
    with store.db.connect() as conn:
        return conn.execute(query).scalar()


def compare_text(report: dict[str, Any]) -> str:
    """The comparison as lines for the terminal."""
    s = report["shadow"]
    agreement, errors = s["agreement"], s["errors"]
    lines = [
        f"{report['model']}: candidate release {report['candidate']} vs stable "
        f"{report['stable']} on {s['pairs']} shadow pairs",
        f"  agreement (identical answers): {_pct(agreement)}",
        f"  5xx, candidate minus stable: {errors['diff']:+.1%} "
        f"[{errors['low']:+.1%}, {errors['high']:+.1%}], exact McNemar p = {errors['p_value']:.3g}",
    ]
    for name, title in CHECKS:
        lines.append(
            f"  {title}: {_paired(s[name]['primary'], s[name]['shadow'], s[name]['paired'])}"
        )
    for what in ("ttft_ms", "tpot_ms", "latency_ms"):
        mine, theirs = s[f"primary_{what}"], s[f"shadow_{what}"]
        lines.append(
            f"  {what[:-3]} p50/p99 ms: stable {_n(mine['p50'])}/{_n(mine['p99'])}, "
            f"candidate {_n(theirs['p50'])}/{_n(theirs['p99'])}"
        )
    lines.append(
        f"  output tokens (mean): stable {_n(s['primary_tokens'])}, "
        f"candidate {_n(s['shadow_tokens'])}"
    )
    graded = report.get("graded")
    if graded is not None:
        lines.append(
            f"  graded with the eval set: {graded['pairs']} pairs of {graded['matched_items']}"
            f" of its {graded['items']} items ({graded['tool_call_pairs']} tool_call pairs left"
            f" out): {_paired(graded['stable'], graded['candidate'], graded['paired'])}"
        )
        for flip in ("right_to_wrong", "wrong_to_right"):
            if graded[flip]:
                lines.append(f"    {flip.replace('_', ' ')}: {', '.join(graded[flip])}")
    for role, live in report["live"].items():
        lines.append(
            f"  live {role} (release {live['release']}): {live['requests']} requests, "
            f"5xx {_pct(live['errors'])}, TTFT p99 {_n(live['ttft_ms']['p99'])} ms"
        )
        for name, title in CHECKS:
            if live[name]["n"]:
                lines.append(f"    {title}: {_pct(live[name])}")
    lines.append(f"  PNG: {report['png']}")
    return "\n".join(lines)


def _pct(p: dict[str, Any]) -> str:
    if not p["n"]:
        return "no samples"
    return f"{p['value']:.1%} [{p['low']:.1%}, {p['high']:.1%}] of {p['n']}"


def _n(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _paired(stable: dict[str, Any], candidate: dict[str, Any], paired: dict[str, Any]) -> str:
    """Both sides' shares and their paired difference, candidate minus stable."""
    sides = f"stable {_pct(stable)}, candidate {_pct(candidate)}"
    if not paired["n"]:
        return sides
    return (
        f"{sides}; candidate minus stable {paired['diff']:+.1%} [{paired['low']:+.1%}, "
        f"{paired['high']:+.1%}] on {paired['n']} pairs ({paired['a_only']} stable only, "
        f"{paired['b_only']} candidate only), exact McNemar p = {paired['p_value']:.3g}"
    )
