"""The plan's latency section: both limits, memory and latency, and which one binds."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from rich.console import Console
from rich.table import Table

from inhouse.plan.errors import PlanError
from inhouse.plan.latency import LatencyPlan, LatencyPoint, Traffic, plan_latency
from inhouse.plan.mixed import BatchLoad, InteractiveLoad, MixedPlan, plan_mixed
from inhouse.plan.mixed_report import render_mixed
from inhouse.plan.perf_model import Hardware, Profile, StepCost
from inhouse.plan.planner import Plan
from inhouse.plan.sim_engine import SchedulerLimits
from inhouse.plan.simulate import Workload, simulate
from inhouse.plan.step_costs import (
    CPU_ROOFLINE_NOTE,
    CpuTarget,
    gpu_hardware,
    plan_roofline_cost,
)
from inhouse.plan.units import milliseconds

OPEN_LOOP_REQUESTS = 200


@dataclass(frozen=True, slots=True)
class LatencyOptions:
    """What the user asked the latency prediction for; None picks the documented default."""

    traffic: Traffic = field(default_factory=Traffic)
    slo_ttft: float = 2.0
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    chunked_prefill: bool = True
    steps: tuple[int, ...] | None = None
    request_rate: float | None = None
    policy: str = "fcfs"
    long_prefill_token_threshold: int | None = None
    background_decode_rows: int | None = None
    batch_load: BatchLoad | None = None
    interactive: InteractiveLoad = field(default_factory=InteractiveLoad)

    def __post_init__(self) -> None:
        if not self.slo_ttft > 0:
            raise PlanError(f"--slo-ttft must be a positive number of seconds, not {self.slo_ttft}")


@dataclass(frozen=True, slots=True)
class OpenLoopPoint:
    """Predicted latencies at a Poisson request rate."""

    rate: float
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float


@dataclass(frozen=True, slots=True)
class LatencyReport:
    """The latency prediction next to the memory limit."""

    cost: StepCost
    limits: SchedulerLimits
    options: LatencyOptions
    latency: LatencyPlan
    memory_limit: int
    open_loop: OpenLoopPoint | None
    mixed: MixedPlan | None = None
    note: str | None = None  # how far to trust the step cost, when it is a guess

    @property
    def binds(self) -> str:
        """ "latency" when fewer requests meet the SLO than fit in memory, else "memory"."""
        return "latency" if self.latency.max_within_slo < self.memory_limit else "memory"

    def to_json(self) -> dict[str, Any]:
        """The section of `inhouse plan --json`."""
        return {
            "step_cost": asdict(self.cost),
            "scheduler": asdict(self.limits),
            "workload": asdict(self.options.traffic),
            "slo_ttft_s": self.latency.slo_ttft,
            "curve": [asdict(p) for p in self.latency.points],
            "max_concurrency_within_slo": self.latency.max_within_slo,
            "predicted_knee": self.latency.knee,
            "memory_max_concurrent": self.memory_limit,
            "binds": self.binds,
            "open_loop": asdict(self.open_loop) if self.open_loop else None,
            "mixed": self.mixed.to_json() if self.mixed else None,
            "note": self.note,
        }


def build_latency(
    plan: Plan, options: LatencyOptions, *, profile: Profile | None, hardware: Hardware | None
) -> LatencyReport:
    """Predict latencies from the profile when given, else from `hardware`'s roofline."""
    speculation = None
    if profile is not None:
        cost, speculation = profile.cost, profile.speculation
        seqs = options.max_num_seqs or profile.max_num_seqs
        budget = options.max_num_batched_tokens or profile.max_num_batched_tokens
    else:
        assert hardware is not None
        cost = plan_roofline_cost(plan, hardware)
        seqs = options.max_num_seqs or plan.max_num_seqs
        budget = options.max_num_batched_tokens or plan.max_num_batched_tokens
    limits = SchedulerLimits(
        max_num_seqs=seqs,
        max_num_batched_tokens=budget,
        chunked_prefill=options.chunked_prefill,
        kv_tokens=plan.kv_cache.num_tokens,
        block_size=plan.inputs.block_size,
        policy=options.policy,
        long_prefill_token_threshold=options.long_prefill_token_threshold,
        background_decode_rows=options.background_decode_rows,
        speculation=speculation,
    )
    latency = plan_latency(cost, limits, options.traffic, options.slo_ttft, options.steps)
    open_loop = None
    if options.request_rate is not None:
        traffic = options.traffic
        result = simulate(
            cost,
            Workload(
                prompt_tokens=traffic.prompt_tokens,
                output_tokens=traffic.output_tokens,
                num_requests=OPEN_LOOP_REQUESTS,
                rate=options.request_rate,
                spread=traffic.spread,
                seed=traffic.seed,
            ),
            limits,
        )
        open_loop = OpenLoopPoint(
            options.request_rate, result.ttft_p(50), result.ttft_p(99), result.tpot_p(50)
        )
    mixed = None
    if options.batch_load is not None:
        mixed = plan_mixed(cost, limits, options.interactive, options.batch_load)
    return LatencyReport(cost, limits, options, latency, plan.max_concurrent, open_loop, mixed)


def latency_section(
    plan: Plan, options: LatencyOptions, *, profile: Profile | None, cpu: CpuTarget | None
) -> LatencyReport:
    """The latency report from a profile, else the CPU's roofline, else the GPU's."""
    if profile is not None:
        return build_latency(plan, options, profile=profile, hardware=None)
    if cpu is not None:
        report = build_latency(plan, options, profile=None, hardware=cpu.hardware())
        return replace(report, note=CPU_ROOFLINE_NOTE)
    if plan.gpu is None:
        raise PlanError("a latency prediction needs --gpu, --cpu or --profile")
    return build_latency(
        plan, options, profile=None, hardware=gpu_hardware(plan.gpu, plan.inputs.tp)
    )


def _curve_table(points: tuple[LatencyPoint, ...], knee: int | None) -> Table:
    table = Table(title="Predicted latency (simulated scheduler)", title_justify="left")
    for name in ("concurrency", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "output tok/s"):
        table.add_column(name, justify="right")
    for p in points:
        table.add_row(
            f"{p.concurrency:,}",
            milliseconds(p.ttft_p50),
            milliseconds(p.ttft_p99),
            milliseconds(p.tpot_p50),
            f"{p.output_tokens_per_s:,.0f}",
            style="red" if knee is not None and p.concurrency >= knee else None,
        )
    return table


def render_latency(report: LatencyReport, console: Console) -> None:
    """The latency lines of the human report."""
    traffic, limits = report.options.traffic, report.limits
    chunked = "chunked prefill" if limits.chunked_prefill else "no chunked prefill"
    console.print(
        f"\n[bold]Latency[/] · step cost from {report.cost.source} · "
        f"{traffic.prompt_tokens} prompt → {traffic.output_tokens} output tokens · "
        f"max-num-seqs {limits.max_num_seqs} · {limits.max_num_batched_tokens:,} tokens a step "
        f"· {chunked} · scheduling {limits.policy} · SLO p99 TTFT ≤ {report.latency.slo_ttft:g} s",
        soft_wrap=True,
    )
    if limits.speculation is not None:
        console.print(limits.speculation.describe(), soft_wrap=True)
    console.print(_curve_table(report.latency.points, report.latency.knee))
    if report.note is not None:
        console.print(f"[yellow]{report.note}[/]", soft_wrap=True)
    within = report.latency.max_within_slo
    console.print(
        f"Latency limit: {within:,} concurrent requests keep p99 TTFT ≤ "
        f"{report.latency.slo_ttft:g} s · memory limit: {report.memory_limit:,} sequences "
        f"→ [bold]{report.binds} binds[/].",
        soft_wrap=True,
    )
    if report.open_loop is not None:
        o = report.open_loop
        console.print(
            f"Open loop at {o.rate:g} requests/s: TTFT p50 {milliseconds(o.ttft_p50)} ms, "
            f"p99 {milliseconds(o.ttft_p99)} ms, TPOT p50 {milliseconds(o.tpot_p50)} ms.",
            soft_wrap=True,
        )
    if report.mixed is not None:
        render_mixed(report.mixed, limits, console)
