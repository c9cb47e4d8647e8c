"""What `inhouse release compare MODEL` reports: the candidate against the stable release on
the shadow pairs (the same requests, answered by both) and on the canary's live figures;
as text, JSON and a PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from inhouse.gateway.db import shadow_pairs
from inhouse.gateway.release_figures import (
    LiveFigures,
    ShadowFigures,
    as_json,
    live_figures,
    shadow_figures,
)
from inhouse.gateway.releases import ReleaseError, ReleaseStore


def compare(store: ReleaseStore, model: str, release: int | None, png: Path) -> dict[str, Any]:
    """The comparison of `release` (default: the candidate, else the last one shadowed) with
    the stable release, as JSON values; the PNG is written to `png`."""
    state = store.state(model)
    number = release or (state.candidate if state else None) or _last_shadowed(store, model)
    if state is None or number is None:
        raise ReleaseError(f"{model!r} has no candidate and no shadow pairs")
    pairs = shadow_figures(store.db, model, number, 0.0)
    stable = live_figures(store.db, model, state.stable, state.since)
    candidate = live_figures(store.db, model, number, state.since)
    plot_compare(model, state.stable, pairs, (stable, candidate), png)
    return {"model": model, "candidate": number, "stable": state.stable, "png": str(png),
            "shadow": as_json(pairs), "live": {"stable": as_json(stable),
                                               "candidate": as_json(candidate)}}  # fmt: skip


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
    if s["json_valid"]["n"]:
        lines.append(f"  valid JSON (json_schema requests): {_pct(s['json_valid'])}")
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
    for role, live in report["live"].items():
        lines.append(
            f"  live {role} (release {live['release']}): {live['requests']} requests, "
            f"5xx {_pct(live['errors'])}, TTFT p99 {_n(live['ttft_ms']['p99'])} ms"
        )
    lines.append(f"  PNG: {report['png']}")
    return "\n".join(lines)


def _pct(p: dict[str, Any]) -> str:
    if not p["n"]:
        return "no samples"
    return f"{p['value']:.1%} [{p['low']:.1%}, {p['high']:.1%}] of {p['n']}"


def _n(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def plot_compare(
    model: str, stable: int, pairs: ShadowFigures, live: tuple[LiveFigures, LiveFigures],
    path: Path,
) -> Path:  # fmt: skip
    """Left: agreement, candidate 5xx and JSON validity with 95% intervals; right: TTFT and
    latency p50/p99 of both releases on the shadow pairs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (shares, times) = plt.subplots(1, 2, figsize=(11, 4.5))
    failed = pairs.errors.a_only + pairs.errors.b_only  # discordant pairs, for the label
    bars = [
        ("agreement", pairs.agreement),
        ("shadow\nfailed", pairs.shadow_errors),
        ("shadow\nvalid JSON", pairs.json_valid),
        ("live 5xx\nstable", live[0].errors),
        ("live 5xx\ncandidate", live[1].errors),
    ]
    shown = [(name, p) for name, p in bars if p.n]
    values = [p.value for _, p in shown]
    # max(0, …): Wilson bounds at 0 % or 100 % sit a rounding error inside the value
    errors = [[max(0.0, p.value - p.low) for _, p in shown],
              [max(0.0, p.high - p.value) for _, p in shown]]  # fmt: skip
    colours = {"agreement": "tab:green", "shadow\nfailed": "tab:orange",
               "shadow\nvalid JSON": "tab:blue", "live 5xx\nstable": "tab:gray"}  # fmt: skip
    shares.bar([n for n, _ in shown], values, yerr=errors, capsize=4,
               color=[colours.get(n, "tab:red") for n, _ in shown])  # fmt: skip
    for i, (_, p) in enumerate(shown):
        shares.annotate(f"{p.value:.0%} (n={p.n})", (i, p.high), ha="center", va="bottom")
    shares.set_ylim(0, 1.12)
    shares.set_ylabel("share (95% Wilson interval)")
    shares.set_title(f"{pairs.pairs} shadow pairs; {failed} pairs where one side failed")
    labels = ["TTFT p50", "TTFT p99", "latency p50", "latency p99"]
    mine = [pairs.primary_ttft_ms.p50, pairs.primary_ttft_ms.p99,
            pairs.primary_latency_ms.p50, pairs.primary_latency_ms.p99]  # fmt: skip
    theirs = [pairs.shadow_ttft_ms.p50, pairs.shadow_ttft_ms.p99,
              pairs.shadow_latency_ms.p50, pairs.shadow_latency_ms.p99]  # fmt: skip
    positions = range(len(labels))
    times.bar([i - 0.2 for i in positions], [v or 0 for v in mine], 0.4,
              label=f"stable (release {stable})")  # fmt: skip
    times.bar([i + 0.2 for i in positions], [v or 0 for v in theirs], 0.4,
              label=f"candidate (release {pairs.release})")  # fmt: skip
    times.set_xticks(list(positions), labels)
    times.set_ylabel("ms")
    times.set_title("the same requests on both releases")
    times.legend(fontsize="small")
    figure.suptitle(f"inhouse release compare: {model}, release {pairs.release} vs {stable}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
