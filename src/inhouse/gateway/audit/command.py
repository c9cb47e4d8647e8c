"""CLI: `inhouse audit`, recent audit rows and per-key totals. Its heavy imports happen
inside the command."""

from __future__ import annotations

from typing import Annotated

import typer

from inhouse.gateway.cli_options import ConfigOption, DatabaseOption, settings_for, short_time


def audit_command(
    config: ConfigOption = None,
    database: DatabaseOption = None,
    limit: Annotated[int, typer.Option(help="How many recent rows to print.")] = 20,
    key: Annotated[str | None, typer.Option(help="Only rows of this key name.")] = None,
) -> None:
    """Print recent audit rows and per-key totals."""
    from rich.console import Console
    from rich.table import Table

    from inhouse.gateway.audit.writer import recent_rows, totals_by_key
    from inhouse.gateway.db_open import open_database

    db = open_database(settings_for(config, database).database)
    console = Console()
    recent = Table(title=f"Last {limit} requests")
    columns = ("time", "key", "model", "backend", "status", "prompt", "completion", "ms", "finish")
    for column in columns:
        recent.add_column(column)
    for row in recent_rows(db, limit, key):
        recent.add_row(
            short_time(row["ts"]),
            str(row["key_name"]),
            str(row["model"]),
            str(row["backend"]) + (" (fallback)" if row["fallback_used"] else ""),
            str(row["status"]),
            str(row["prompt_tokens"]),
            str(row["completion_tokens"]),
            f"{row['latency_ms']:.1f}" if row["latency_ms"] is not None else "",
            str(row["finish_reason"] or ""),
        )
    console.print(recent)
    totals = Table(title="Totals per key")
    for column in ("key", "requests", "errors", "prompt tokens", "completion tokens", "fallbacks"):
        totals.add_column(column)
    for row in totals_by_key(db):
        totals.add_row(*(str(row[c]) for c in row))
    console.print(totals)
