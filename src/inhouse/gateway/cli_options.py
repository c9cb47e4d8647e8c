"""What the gateway's commands share (`gateway`, `keys`, `audit`, `usage`, `teams`, `cost`,
`release`): the `--config`, `--database` and `--adapters` options and the settings they
name, a duration option read into seconds, and a timestamp as their tables show it."""

from __future__ import annotations

import dataclasses
import tomllib
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="Gateway TOML file (for its database).")
]
DatabaseOption = Annotated[
    str | None,
    typer.Option("--database", help="SQLAlchemy URL; overrides the config's gateway.database."),
]
AdaptersOption = Annotated[
    str | None, typer.Option(help="Comma-separated LoRA adapters allowed, or 'all'.")
]
MaxImagesOption = Annotated[
    int | None,
    typer.Option(help="Images one request may hold, below the model's (update: 0, no limit)."),
]


def load_settings(path: Path) -> Any:
    """The gateway config at `path`; a file that cannot be read or is invalid ends the
    command with one line on stderr (exit 2), not a traceback."""
    from inhouse.gateway.config import ConfigError
    from inhouse.gateway.config_file import load_config

    try:
        return load_config(path)
    except (ConfigError, OSError, tomllib.TOMLDecodeError) as err:
        typer.echo(f"error: {path}: {err}", err=True)
        raise typer.Exit(2) from None


def settings_for(config: Path | None, database: str | None) -> Any:
    """The gateway config of `--config` (or the defaults), with `--database` over its own."""
    from inhouse.gateway.config import GatewayConfig

    settings = load_settings(config) if config else GatewayConfig(models=())
    if database:
        settings = dataclasses.replace(settings, database=database)
    return settings


def parse_period(text: str) -> float:
    """A duration (`30d`, `1h`) in seconds; a bad one is the option's error."""
    from inhouse.gateway.durations import parse_duration

    try:
        return parse_duration(text)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


def short_time(ts: float | None) -> str:
    """A timestamp as the tables show it (local month-day and time), blank for none."""
    return "" if ts is None else datetime.fromtimestamp(ts).strftime("%m-%d %H:%M:%S")
