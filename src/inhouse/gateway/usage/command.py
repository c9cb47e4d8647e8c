"""CLI: `inhouse usage`: usage per person, team, model, release, adapter or day, from the
audit."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer

from inhouse.gateway.cli_options import ConfigOption, DatabaseOption, parse_period, settings_for


def usage_command(
    by: Annotated[
        str, typer.Option(help="person, team, model, release, adapter or day.")
    ] = "person",
    since: Annotated[str, typer.Option(help="How far back, e.g. 30d, 12h.")] = "30d",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print CSV.")] = False,
    config: ConfigOption = None,
    database: DatabaseOption = None,
) -> None:
    """Requests, errors, tokens and their cost per group, aggregated in the database."""
    # SQLAlchemy, rich: loaded when the command runs, not with the CLI.
    from rich.console import Console
    from rich.table import Table

    from inhouse.gateway.db_open import open_database
    from inhouse.gateway.usage.report import COLUMNS, UnknownGrouping, as_records, usage
    from inhouse.gateway.usage.report import as_csv as to_csv

    settings = settings_for(config, database)
    start = time.time() - parse_period(since)
    try:
        rows = usage(open_database(settings.database), by, start, prices=settings.cost.charged)
    except UnknownGrouping as err:
        raise typer.BadParameter(str(err)) from None
    if as_json:
        typer.echo(json.dumps({"by": by, "since": start, "rows": as_records(rows)}, indent=1))
        return
    if as_csv:
        typer.echo(to_csv(rows), nl=False)
        return
    table = Table(title=f"Usage by {by}, last {since}")
    for column in COLUMNS:
        table.add_column(by if column == "group" else column.replace("_", " "))
    for record in as_records(rows):
        cost = f"{record['cost']:.2f} {settings.cost.currency}".strip()
        table.add_row(*(str(record[c]) for c in COLUMNS[:-1]), cost)
    Console().print(table)
