"""The plan's mixed-class lines: interactive TTFT under the stated batch load, per policy."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from inhouse.plan.mixed import MixedPlan
from inhouse.plan.sim_engine import SchedulerLimits
from inhouse.plan.units import milliseconds


def _table(mixed: MixedPlan, chosen: str) -> Table:
    table = Table(
        title="Interactive latency (ms) under the batch load, simulated",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    headers = (
        "policy",
        "TTFT p50",
        "TTFT p99",
        "p99 ×idle",
        "TPOT p50",
        "batch tok/s",
        "vs alone",
        "preempt",
    )
    table.add_column(headers[0], no_wrap=True, min_width=9)
    for name in headers[1:]:
        table.add_column(name, justify="right")
    for p in mixed.points:
        table.add_row(
            p.policy + ("*" if p.policy == chosen else ""),
            milliseconds(p.ttft_p50),
            milliseconds(p.ttft_p99),
            f"{p.ttft_p99_over_idle:.2f}×",
            milliseconds(p.tpot_p50),
            f"{p.batch_tokens_per_s:,.{1 if p.batch_tokens_per_s < 100 else 0}f}",
            f"{p.batch_share:.0%}",
            f"{p.preemptions:,}",
            style="bold" if p.policy == chosen else None,
        )
    return table


def render_mixed(mixed: MixedPlan, limits: SchedulerLimits, console: Console) -> None:
    """The workload in words, the table, and the `bench --mix` run that measures it."""
    i, b = mixed.interactive, mixed.batch
    threshold = limits.long_prefill_token_threshold
    cap = "default 128" if threshold is None else (f"{threshold:,}" if threshold else "none")
    rows = limits.background_decode_rows
    background = "default 4" if rows is None else (f"{rows:,}" if rows else "none")
    console.print(
        f"\n[bold]Mixed classes[/] · interactive ({i.tenant}, priority {i.priority}): "
        f"{i.clients} client(s) × {i.requests} chats of {i.prompt_tokens} → {i.output_tokens} "
        f"tokens one after another, from {mixed.start_s:.1f} s · batch ({b.tenant}, priority "
        f"{b.priority}): {b.in_flight} in flight of {b.prompt_tokens:,} → {b.output_tokens:,} "
        f"tokens · under priority and fair, long-prefill cap {cap}, background decode rows "
        f"{background}",
        soft_wrap=True,
    )
    console.print(_table(mixed, limits.policy))
    idle = mixed.points[0].idle_ttft_p99
    console.print(
        f"* --scheduling-policy {limits.policy}. Idle server: interactive TTFT p99 "
        f"{milliseconds(idle)} ms; batch tok/s vs the batch alone over the same window. "
        "Measure it with "
        "`inhouse bench run --ignore-eos "
        f"--mix 'interactive: max-concurrency={i.clients}, input-len={i.prompt_tokens}, "
        f"output-len={i.output_tokens}, num-prompts={i.requests}, priority={i.priority}, "
        f"cache-salt={i.tenant}, delay={mixed.start_s:.0f}' "
        f"--mix 'batch: max-concurrency={b.in_flight}, input-len={b.prompt_tokens}, "
        f"output-len={b.output_tokens}, priority={b.priority}, cache-salt={b.tenant}' …`.",
        soft_wrap=True,
        highlight=False,
    )
