"""CLI: `inhouse gateway`. Its heavy imports (Starlette, SQLAlchemy, uvicorn) happen inside
the command."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from inhouse.gateway.cli_options import load_settings


def gateway_command(
    config: Annotated[Path, typer.Option("--config", "-c", help="Gateway TOML file.")],
    host: Annotated[str | None, typer.Option(help="Override gateway.host.")] = None,
    port: Annotated[int | None, typer.Option(help="Override gateway.port.")] = None,
    access_log: Annotated[
        bool | None,
        typer.Option("--access-log/--no-access-log", help="Override gateway.access_log."),
    ] = None,
) -> None:
    """Run the authenticated gateway (keys, limits, audit, routing, health, fallback)."""
    from inhouse.gateway.run import run_gateway

    settings = load_settings(config)
    given = (("host", host), ("port", port), ("access_log", access_log))
    overrides = {k: v for k, v in given if v is not None}
    run_gateway(dataclasses.replace(settings, **overrides))
