"""Console report: a rich table for a run, one row per step for a sweep, and the verdict."""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.table import Table

from inhouse.bench.metrics import Distribution, RunSummary
from inhouse.bench.run import RunResult
from inhouse.bench.sweep import Verdict


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1000:.1f}"


def _num(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.0f}%"


def failures_text(summary: RunSummary) -> str:
    """`3 (http_429: 2, timeout: 1)` or `0`."""
    if not summary.failed:
        return "0"
    parts = ", ".join(f"{kind}: {count}" for kind, count in summary.failures.items())
    return f"{summary.failed} ({parts})"


def run_table(result: RunResult, title: str = "inhouse bench") -> Table:
    """Totals first, then latency percentiles in milliseconds."""
    s = result.summary
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    for column in ("mean", "p50", "p90", "p95", "p99"):
        table.add_column(column, justify="right")
    latencies: list[tuple[str, Distribution]] = [
        ("TTFT (ms)", s.ttft),
        ("TPOT (ms, excl. 1st token)", s.tpot),
        ("ITL (ms)", s.itl),
        ("E2E (ms)", s.e2e),
    ]
    for name, dist in latencies:
        table.add_row(name, *(_ms(v) for v in (dist.mean, dist.p50, dist.p90, dist.p95, dist.p99)))
    table.caption = "\n".join(
        [
            f"successful {s.completed} · failed {failures_text(s)} · duration {s.duration:.2f} s",
            f"input tokens {s.total_input_tokens} · output tokens {s.total_output_tokens}"
            f" (from {', '.join(f'{k}: {v}' for k, v in s.token_sources.items()) or '—'})",
            f"requests/s {s.request_throughput:.2f} · output tok/s {s.output_throughput:.1f}"
            f" · total tok/s {s.total_token_throughput:.1f}"
            + (
                ""
                if s.goodput is None
                else f" · goodput {s.goodput:.2f} req/s ({s.slo_met} met SLO)"
            ),
            f"server: KV cache peak {_percent(result.server.kv_cache_usage_peak)}"
            f" · waiting peak {_num(result.server.waiting_peak, 0)}"
            f" · prefix-cache hits {_percent(result.server.prefix_cache_hit_rate)}"
            f" · preemptions {_num(result.server.preemptions, 0)}"
            + (f" ({result.server.error})" if result.server.error else ""),
            *_ttft_split(result),
        ]
    )
    return table


def _ttft_split(result: RunResult) -> list[str]:
    """TTFT's mean told apart into the server's image encoding (where its /metrics counts it,
    as ours does) and the rest: queueing and prefill."""
    images, seconds = result.server.images_encoded, result.server.image_encode_seconds
    ttft, completed = result.summary.ttft.mean, result.summary.completed
    if not images or seconds is None or ttft is None or not completed:
        return []
    encode = seconds / completed
    return [
        f"images encoded {images:.0f} ({1000 * seconds / images:.1f} ms each) · TTFT mean "
        f"{1000 * ttft:.1f} ms = encode {1000 * encode:.1f} + queue and prefill "
        f"{1000 * (ttft - encode):.1f} ms a request"
    ]


def _ms_short(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    ms = seconds * 1000
    return f"{ms:.1f}" if ms < 10 else f"{ms:.0f}"


def sweep_table(runs: Sequence[RunResult], verdict: Verdict) -> Table:
    """One row per concurrency step; the plan's prediction and the knee are marked."""
    table = Table(
        title="inhouse bench sweep", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False
    )
    headers = (
        "in\nflight",
        "ok/\nfailed",
        "req/s",
        "good-\nput",
        "output\ntok/s",
        "TTFT ms\np50 / p99",
        "TPOT ms\np50 / p99",
        "KV\npeak",
        "wait\npeak",
        "",
    )
    for header in headers:
        table.add_column(header, justify="right")
    for run in runs:
        s = run.summary
        concurrency = run.shape.max_concurrency or 0
        marks = []
        if verdict.knee == concurrency:
            marks.append("knee")
        if verdict.predicted is not None and concurrency == _nearest(runs, verdict.predicted):
            marks.append("≈plan")
        table.add_row(
            str(concurrency),
            f"{s.completed}/{s.failed}",
            _num(s.request_throughput),
            _num(s.goodput),
            _num(s.output_throughput, 1),
            f"{_ms_short(s.ttft.p50)} / {_ms_short(s.ttft.p99)}",
            f"{_ms_short(s.tpot.p50)} / {_ms_short(s.tpot.p99)}",
            _percent(run.server.kv_cache_usage_peak),
            _num(run.server.waiting_peak, 0),
            " ".join(marks),
        )
    failures = [
        f"{run.shape.max_concurrency}: {failures_text(run.summary)}"
        for run in runs
        if run.summary.failed
    ]
    lines = [verdict.sentence, *(["failures at " + "; ".join(failures)] if failures else [])]
    table.caption = "\n".join(lines)
    return table


def mix_table(runs: Sequence[RunResult]) -> Table:
    """A mixed run's classes side by side: one row each."""
    table = Table(
        title="inhouse bench --mix", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False
    )
    table.add_column("class", no_wrap=True)
    for header in ("prio", "in\nflight", "ok/\nfailed"):
        table.add_column(header, justify="right")
    for header in ("TTFT ms\np50 / p99", "TPOT ms\np50 / p99"):
        table.add_column(header, justify="right", no_wrap=True)
    for header in ("output\ntok/s", "time\ns"):
        table.add_column(header, justify="right")
    lines = []
    for run in runs:
        s, spec = run.summary, run.traffic_class or {}
        priority = spec.get("priority")
        table.add_row(
            str(spec.get("name", "?")),
            "—" if priority is None else str(priority),
            str(run.shape.max_concurrency or 0),
            f"{s.completed}/{s.failed}",
            f"{_ms_short(s.ttft.p50)} / {_ms_short(s.ttft.p99)}",
            f"{_ms_short(s.tpot.p50)} / {_ms_short(s.tpot.p99)}",
            _num(s.output_throughput, 1),
            _num(s.duration, 1),
        )
        if spec.get("background"):
            lines.append(f"{spec.get('name')}: background, in flight until the others were done")
        if s.failed:
            lines.append(f"{spec.get('name')} failures: {failures_text(s)}")
    table.caption = "\n".join(lines) or None
    return table


def _nearest(runs: Sequence[RunResult], predicted: float) -> int:
    steps = [run.shape.max_concurrency or 0 for run in runs]
    return min(steps, key=lambda step: abs(step - predicted))


def print_notes(console: Console, notes: Sequence[str]) -> None:
    """Notes about how numbers were obtained (fallbacks, missing endpoints)."""
    for note in notes:
        console.print(f"[yellow]note:[/yellow] {note}")
