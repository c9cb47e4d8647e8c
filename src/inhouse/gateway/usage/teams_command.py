"""CLI: `inhouse teams create|list|update`: a team's shared token quota and money budget, and
the LoRA adapters its keys may use."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from inhouse.gateway.cli_options import (
    AdaptersOption,
    ConfigOption,
    DatabaseOption,
    parse_period,
    settings_for,
)
from inhouse.gateway.name_lists import from_option, shown

teams_app = typer.Typer(
    help="Teams: a token quota and a money budget per period, shared by their keys.",
    no_args_is_help=True,
)

QuotaOption = Annotated[int | None, typer.Option(help="Tokens per period (0: no quota).")]
BudgetOption = Annotated[
    float | None, typer.Option(help="Money per period, at \\[cost] prices (0: no budget).")
]
SoftOption = Annotated[
    bool | None,
    typer.Option("--hard-stop/--warn-only", help="Refuse (429) when spent, or only warn."),
]


@teams_app.command("create")
def teams_create(
    name: str,
    quota_tokens: QuotaOption = None,
    budget: BudgetOption = None,
    period: Annotated[str, typer.Option(help="Period, e.g. 1d, 30d.")] = "30d",
    hard_stop: SoftOption = None,
    adapters: AdaptersOption = None,
    config: ConfigOption = None,
    database: DatabaseOption = None,
) -> None:
    """Create a team; its keys share its quota and budget, and are limited to its adapters."""
    limits = _limits(quota_tokens, budget, hard_stop, adapters)
    try:
        _teams(config, database).create(name, parse_period(period), **limits)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    typer.echo(f"created team {name!r}")


@teams_app.command("update")
def teams_update(
    name: str,
    quota_tokens: QuotaOption = None,
    budget: BudgetOption = None,
    period: Annotated[str | None, typer.Option(help="Period, e.g. 30d.")] = None,
    hard_stop: SoftOption = None,
    adapters: AdaptersOption = None,
    config: ConfigOption = None,
    database: DatabaseOption = None,
) -> None:
    """Change a team's quota, budget, period, hard stop or adapters; applies from its next
    request."""
    # SQLAlchemy: loaded when the command runs, not with the CLI.
    from inhouse.gateway.usage.teams import UnknownTeam

    changes = _limits(quota_tokens, budget, hard_stop, adapters)
    if period is not None:
        changes["period_s"] = parse_period(period)
    if not changes:
        raise typer.BadParameter("nothing to update: pass at least one option")
    try:
        _teams(config, database).update(name, **changes)
    except UnknownTeam as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(1) from None
    typer.echo(f"updated team {name!r}: {', '.join(sorted(changes))}")


@teams_app.command("list")
def teams_list(config: ConfigOption = None, database: DatabaseOption = None) -> None:
    """List teams with what their current period has used of their quota and budget (a
    team's usage in full: `inhouse usage --by team`)."""
    # rich: loaded when the command runs, not with the CLI.
    from rich.console import Console
    from rich.table import Table

    table = Table()
    for column in ("team", "period", "tokens used", "money used", "on exhaustion", "adapters"):
        table.add_column(column)
    now = time.time()
    for team in _teams(config, database).list():
        tokens, money = team.used_at(now)
        table.add_row(
            team.name,
            f"{team.period_s / 86400:g}d",
            f"{tokens}/{team.quota_tokens}" if team.quota_tokens else "no quota",
            f"{money:.2f}/{team.budget:g}" if team.budget else "no budget",
            "429" if team.hard_stop else "warn",
            shown(team.adapters),
        )
    Console().print(table)


def _limits(
    quota: int | None, budget: float | None, hard_stop: bool | None, adapters: str | None
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if adapters is not None:
        out["adapters"] = from_option(adapters)
    if quota is not None:
        if quota < 0:
            raise typer.BadParameter("--quota-tokens must be >= 0")
        out["quota_tokens"] = quota or None
    if budget is not None:
        if not budget >= 0:
            raise typer.BadParameter("--budget must be >= 0")
        out["budget"] = budget or None
    if hard_stop is not None:
        out["hard_stop"] = hard_stop
    return out


def _teams(config: Path | None, database: str | None) -> Any:
    # SQLAlchemy: loaded when the command runs, not with the CLI.
    from inhouse.gateway.db_open import open_database
    from inhouse.gateway.usage.teams import TeamStore

    return TeamStore(open_database(settings_for(config, database).database))
