"""CLI: `inhouse cost`: what the audited traffic cost self-hosted and on the hosted API."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Annotated

import typer

from inhouse.gateway.cli_options import ConfigOption, DatabaseOption, parse_period, settings_for


def cost_command(
    since: Annotated[str, typer.Option(help="How far back, e.g. 30d, 1d.")] = "30d",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    cost_file: Annotated[
        Path | None,
        typer.Option("--cost", help="A TOML file whose \\[cost] section to use (else --config's)."),
    ] = None,
    config: ConfigOption = None,
    database: DatabaseOption = None,
) -> None:
    """Cost per million tokens, per request and per successful task against the hosted API
    in `\\[cost]`, and the break-even volume. A successful task: answered 200 with finish
    reason stop or tool_calls, and not retried with the same prompt by the same key within
    `\\[cost] retry_window_s`."""
    # SQLAlchemy: loaded when the command runs, not with the CLI.
    from inhouse.cost.compare import compare, report_lines
    from inhouse.cost.settings import CostConfigError, load_cost
    from inhouse.gateway.db_open import open_database
    from inhouse.gateway.usage.traffic import measured

    settings = settings_for(config, database)
    try:
        cost = settings.cost if cost_file is None else load_cost(cost_file)
    except (CostConfigError, OSError) as err:
        raise typer.BadParameter(f"--cost: {err}") from None
    now = time.time()
    traffic = measured(open_database(settings.database), now - parse_period(since), now,
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
