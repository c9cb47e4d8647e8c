"""The `inhouse` command: wires the subcommands together and holds no logic."""

from __future__ import annotations

import typer

from inhouse import __version__
from inhouse.bench.command import bench_app
from inhouse.eval.command import eval_command
from inhouse.gateway.audit.command import audit_command
from inhouse.gateway.command import gateway_command
from inhouse.gateway.keys_command import keys_app
from inhouse.gateway.release_tools.command import release_app
from inhouse.gateway.usage.command import usage_command
from inhouse.gateway.usage.cost_command import cost_command
from inhouse.gateway.usage.teams_command import teams_app
from inhouse.launch.plan_command import plan
from inhouse.manifests.command import models_app
from inhouse.observe.command import observe_app
from inhouse.server.serve import serve_command
from inhouse.up.command import up_command

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


app.add_typer(bench_app, name="bench")
app.command("eval")(eval_command)
app.command("gateway")(gateway_command)
app.add_typer(keys_app, name="keys")
app.add_typer(teams_app, name="teams")
app.add_typer(models_app, name="models")
app.command("audit")(audit_command)
app.command("usage")(usage_command)
app.command("cost")(cost_command)
app.add_typer(observe_app, name="observe")
app.add_typer(release_app, name="release")
app.command("up")(up_command)
app.command("plan")(plan)
app.command("serve")(serve_command)


@app.command()
def version() -> None:
    """Print the inhouse version."""
    typer.echo(__version__)


def main() -> None:
    """Entry point of the `inhouse` console script."""
    app()
