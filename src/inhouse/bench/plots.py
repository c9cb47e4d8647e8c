"""PNG plots of a sweep: latency percentiles and throughput against concurrency (matplotlib Agg)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from inhouse.bench.metrics import Slo
from inhouse.bench.run import RunResult
from inhouse.bench.sweep import Verdict
from inhouse.plan.latency import LatencyPoint

LATENCY_PNG = "latency_vs_concurrency.png"
THROUGHPUT_PNG = "throughput_vs_concurrency.png"


def _pyplot():  # type: ignore[no-untyped-def]
    # matplotlib: loaded only when this runs, not with the module.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _ms(values: Sequence[float | None]) -> list[float]:
    return [float("nan") if v is None else v * 1000 for v in values]


def _mark_plan_and_knee(axis, verdict: Verdict) -> None:  # type: ignore[no-untyped-def]
    if verdict.predicted is not None:
        axis.axvline(
            verdict.predicted,
            color="tab:green",
            linestyle="--",
            label=f"plan's prediction ({verdict.predicted:g})",
        )
    if verdict.knee is not None:
        axis.axvline(verdict.knee, color="tab:red", linestyle=":", label=f"knee ({verdict.knee})")


def _concurrency_axis(axis, steps: Sequence[int]) -> None:  # type: ignore[no-untyped-def]
    axis.set_xscale("log", base=2)
    axis.set_xticks(list(steps), [str(s) for s in steps])
    axis.set_xlabel("concurrency (requests in flight)")
    axis.grid(True, which="major", alpha=0.3)


def plot_latency(
    runs: Sequence[RunResult],
    slo: Slo,
    verdict: Verdict,
    path: Path,
    predicted: Sequence[LatencyPoint] = (),
) -> Path:
    """p50/p99 TTFT and TPOT against concurrency, with the SLO lines, the plan and the knee,
    and the predicted curves dashed when given."""
    plt = _pyplot()
    steps = [run.shape.max_concurrency or 0 for run in runs]
    figure, (ttft_axis, tpot_axis) = plt.subplots(1, 2, figsize=(12, 4.8))
    panels = ((ttft_axis, "ttft", "TTFT", slo.ttft), (tpot_axis, "tpot", "TPOT", slo.tpot))
    for axis, key, name, limit in panels:
        for quantile, style in (("p50", "o-"), ("p99", "s-")):
            values = [getattr(getattr(run.summary, key), quantile) for run in runs]
            axis.plot(steps, _ms(values), style, label=f"{name} {quantile}")
            if predicted:
                guess = [getattr(p, f"{key}_{quantile}") for p in predicted]
                xs = [p.concurrency for p in predicted]
                axis.plot(xs, _ms(guess), style[0] + "--", alpha=0.6, label=f"predicted {quantile}")
        if limit is not None:
            axis.axhline(
                limit * 1000, color="black", linewidth=1, label=f"SLO: {name} ≤ {limit * 1000:g} ms"
            )
        _mark_plan_and_knee(axis, verdict)
        _concurrency_axis(axis, steps)
        axis.set_ylabel(f"{name} (ms)")
        axis.set_title(f"{name} vs concurrency")
        axis.legend(loc="best", fontsize="small")
    ttft_axis.set_title("TTFT vs concurrency")
    tpot_axis.set_title("TPOT (excl. first token) vs concurrency")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_throughput(
    runs: Sequence[RunResult],
    verdict: Verdict,
    path: Path,
    predicted: Sequence[LatencyPoint] = (),
) -> Path:
    """Token and request throughput (and goodput) against concurrency, with plan and knee,
    and the predicted output throughput dashed when given."""
    plt = _pyplot()
    steps = [run.shape.max_concurrency or 0 for run in runs]
    figure, (token_axis, request_axis) = plt.subplots(1, 2, figsize=(12, 4.8))
    token_axis.plot(steps, [r.summary.output_throughput for r in runs], "o-", label="output")
    token_axis.plot(steps, [r.summary.total_token_throughput for r in runs], "s-", label="total")
    if predicted:
        token_axis.plot(
            [p.concurrency for p in predicted],
            [p.output_tokens_per_s for p in predicted],
            "o--",
            alpha=0.6,
            label="predicted output",
        )
    token_axis.set_ylabel("tokens/s")
    token_axis.set_title("Token throughput vs concurrency")
    request_axis.plot(steps, [r.summary.request_throughput for r in runs], "o-", label="requests/s")
    goodput = [r.summary.goodput for r in runs]
    if any(g is not None for g in goodput):
        request_axis.plot(
            steps,
            [float("nan") if g is None else g for g in goodput],
            "s--",
            label="goodput (met every SLO)",
        )
    request_axis.set_ylabel("requests/s")
    request_axis.set_title("Request throughput vs concurrency")
    for axis in (token_axis, request_axis):
        _mark_plan_and_knee(axis, verdict)
        _concurrency_axis(axis, steps)
        axis.set_ylim(bottom=0)
        axis.legend(loc="best", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_sweep(
    runs: Sequence[RunResult],
    slo: Slo,
    verdict: Verdict,
    out_dir: Path,
    predicted: Sequence[LatencyPoint] = (),
) -> list[Path]:
    """Both PNGs into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        plot_latency(runs, slo, verdict, out_dir / LATENCY_PNG, predicted),
        plot_throughput(runs, verdict, out_dir / THROUGHPUT_PNG, predicted),
    ]
