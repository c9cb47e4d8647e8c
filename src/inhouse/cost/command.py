"""CLI: `inhouse cost`: what the audited traffic cost self-hosted and on the hosted API."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from inhouse.gateway.command import ConfigOption, DatabaseOption, _period, _settings

if TYPE_CHECKING:
    from inhouse.cost.compare import Comparison


def cost_command(
    since: Annotated[str, typer.Option(help="How far back, e.g. 30d, 1d.")] = "30d",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    cost_file: Annotated[
        Path | None,
        typer.Option("--cost", help="A TOML file whose [cost] section to use (else --config's)."),
    ] = None,
    config: ConfigOption = None,
    database: DatabaseOption = None,
) -> None:
    """Cost per million tokens, per request and per successful task against the hosted API
    in `[cost]`, and the break-even volume. A successful task: answered 200 with finish
    reason stop or tool_calls, and not retried with the same prompt by the same key within
    `[cost] retry_window_s`."""
    from inhouse.cost.compare import compare
    from inhouse.cost.settings import CostConfigError, load_cost
    from inhouse.cost.traffic import measured
    from inhouse.gateway.db import open_database

    settings = _settings(config, database)
    try:
        cost = settings.cost if cost_file is None else load_cost(cost_file)
    except (CostConfigError, OSError) as err:
        raise typer.BadParameter(f"--cost: {err}") from None
    now = time.time()
    traffic = measured(open_database(settings.database), now - _period(since), now,
                       cost.retry_window_s)  # fmt: skip
    result = compare(traffic, cost)
    if as_json:
        record = dataclasses.asdict(result)
        record["currency"] = cost.currency
        record["requests_per_day"] = result.requests_per_day
        typer.echo(json.dumps(record, indent=1))
        return
    for line in report_lines(result, cost.currency, since):
        typer.echo(line)


def report_lines(result: Comparison, currency: str, since: str) -> list[str]:
    """The report as text lines."""
    t = result.traffic

    def money(value: float | None, digits: int = 4) -> str:
        return "-" if value is None else f"{value:,.{digits}f} {currency}".strip()

    lines = [
        f"Traffic, last {since}: {t.requests:,} requests answered ({result.requests_per_day:,.0f}"
        f"/day), {t.prompt_tokens:,} input + {t.completion_tokens:,} output tokens,"
        f" {t.successful_tasks:,} successful tasks",
        f"Self-hosted cost:   {money(result.self_hosted, 2)}",
        f"  per million tokens  {money(result.per_million_tokens)}",
        f"  per request         {money(result.per_request, 6)}",
        f"  per successful task {money(result.per_successful_task, 6)}",
        f"Hosted API, same traffic: {money(result.hosted, 2)}",
        f"  per request         {money(result.hosted_per_request, 6)}",
        f"  per successful task {money(result.hosted_per_successful_task, 6)}",
    ]
    if result.utilisation is not None:
        lines.append(f"Utilisation of the planned capacity: {result.utilisation:.1%}")
    if result.break_even_requests_per_day is not None:
        cheaper = "self-hosting" if result.self_hosted < result.hosted else "the hosted API"
        lines.append(
            f"Break-even: {result.break_even_requests_per_day:,.0f} requests/day of this mix;"
            f" at this volume {cheaper} is cheaper"
        )
    return lines
