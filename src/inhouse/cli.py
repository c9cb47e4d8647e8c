"""The `inhouse` command: wires the subcommands together and holds no logic."""

from __future__ import annotations

import typer

from inhouse import __version__

app = typer.Typer(
    name="inhouse",
    help="Run an open-weight LLM on your own machines as an OpenAI-compatible service.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def root() -> None:
    """plan · serve · gateway · bench: an open-weight LLM as your own OpenAI-compatible service."""


@app.command()
def version() -> None:
    """Print the inhouse version."""
    typer.echo(__version__)


def main() -> None:
    """Entry point of the `inhouse` console script."""
    app()
