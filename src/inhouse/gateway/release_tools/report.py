"""What `inhouse release status` shows: the state, each release, the stable's and the
candidate's live figures since the candidate took its place, the shadow pairs' figures,
and the latest changes."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from inhouse.gateway.releases.figures import as_json, live_figures, shadow_figures
from inhouse.gateway.releases.store import ReleaseStore


def status_json(store: ReleaseStore, model: str) -> dict[str, Any]:
    """The model's release status as JSON values."""
    state = store.state(model)
    if state is None:
        return {"model": model, "releases": [], "state": None, "events": []}
    releases = store.releases(model)
    report: dict[str, Any] = {
        "model": model,
        "state": dataclasses.asdict(state),
        "releases": [_release(r) for r in releases.values()],
        "stable": as_json(live_figures(store.db, model, state.stable, state.since)),
        "events": store.events(model, 10),
    }
    if state.candidate is not None:
        report["candidate"] = as_json(live_figures(store.db, model, state.candidate, state.since))
        report["shadow"] = as_json(shadow_figures(store.db, model, state.candidate, state.since))
    return report


def _release(release: Any) -> dict[str, Any]:
    out = dataclasses.asdict(release)
    if out["manifest"] is not None:
        out["manifest"] = {k: v for k, v in out["manifest"].items() if k != "files"}
    return out


def print_status(report: dict[str, Any]) -> None:
    """The report as tables on the terminal."""
    # rich: loaded when the report is printed, not with the CLI.
    from rich.console import Console
    from rich.table import Table

    console = Console()
    state = report["state"]
    if state is None:
        console.print(f"{report['model']}: no releases yet (its config backends answer)")
        return
    head = f"{report['model']}: stable release {state['stable']}"
    if state["candidate"] is not None:
        head += (
            f", candidate {state['candidate']} at {state['percent']:g}% of keys,"
            f" shadow {state['shadow']:g}%"
        )
    console.print(head)
    figures = Table(title="Live figures since the candidate took its place")
    for column in ("release", "requests", "5xx rate (95% CI)", "TTFT p50/p99 ms",
                   "latency p50/p99 ms", "output tokens"):  # fmt: skip
        figures.add_column(column)
    for role in ("stable", "candidate"):
        if role in report:
            f = report[role]
            figures.add_row(
                f"{f['release']} ({role})", str(f["requests"]), _share(f["errors"]),
                _pcts(f["ttft_ms"]), _pcts(f["latency_ms"]), _num(f["mean_output_tokens"]),
            )  # fmt: skip
    console.print(figures)
    shadow = report.get("shadow")
    if shadow is not None and shadow["pairs"]:
        errors = shadow["errors"]
        console.print(
            f"shadow pairs: {shadow['pairs']} · agreement {_share(shadow['agreement'])} · "
            f"5xx difference {errors['diff']:+.1%} [{errors['low']:+.1%}, {errors['high']:+.1%}]"
            f" (McNemar p={errors['p_value']:.3g}) · TTFT p99 "
            f"{_num(shadow['primary_ttft_ms']['p99'])} → "
            f"{_num(shadow['shadow_ttft_ms']['p99'])} ms"
        )
    events = Table(title="Latest changes")
    for column in ("time", "who", "action", "release", "why"):
        events.add_column(column)
    for e in report["events"]:
        when = dt.datetime.fromtimestamp(e["ts"], dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
        events.add_row(when, e["actor"], e["action"], str(e["release"]), e["reason"] or "")
    console.print(events)


def _share(p: dict[str, Any]) -> str:
    if not p["n"]:
        return "–"
    return f"{p['value']:.1%} [{p['low']:.1%}, {p['high']:.1%}] of {p['n']}"


def _pcts(p: dict[str, Any]) -> str:
    return f"{_num(p['p50'])} / {_num(p['p99'])}"


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"
