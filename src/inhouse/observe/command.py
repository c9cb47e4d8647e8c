"""`inhouse observe`: write the Prometheus rules, scrape config and Grafana dashboard."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

observe_app = typer.Typer(
    help="Operate inhouse: Prometheus rules and config, the Grafana dashboard.",
    no_args_is_help=True,
)


def _write(text: str, out: Path | None) -> None:
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        typer.echo(f"wrote {out}", err=True)


def _fail(message: str) -> None:
    typer.echo(f"inhouse observe: {message}", err=True)
    raise typer.Exit(2)


@observe_app.command("rules")
def rules_command(
    slo: Annotated[
        str | None, typer.Option(help="ttft=2s,tpot=100ms: the p99 latency objectives.")
    ] = None,
    plan: Annotated[
        Path | None, typer.Option(help="`inhouse plan --json` output: adds a batch-full alert.")
    ] = None,
    kv_usage: Annotated[float, typer.Option(help="KV-cache share that alerts.")] = 0.9,
    pending: Annotated[str, typer.Option(help="`for:` of the latency/KV/error alerts.")] = "5m",
    rate_window: Annotated[str, typer.Option(help="Window of rates and quantiles.")] = "5m",
    out: Annotated[Path | None, typer.Option(help="File to write (default: stdout).")] = None,
) -> None:
    """Recording and alerting rules for the serve, vLLM and gateway metrics."""
    # PyYAML: loaded when the command runs, not with the CLI.
    from inhouse.bench.metrics import parse_slo
    from inhouse.observe.rules import AlertThresholds, rules_yaml

    if not 0 < kv_usage <= 1:
        _fail("--kv-usage must lie in (0, 1]")
    thresholds = AlertThresholds(kv_usage=kv_usage, pending=pending, rate_window=rate_window)
    if slo is not None:
        try:
            objectives = parse_slo(slo)
        except ValueError as e:
            _fail(f"--slo: {e}")
        thresholds = thresholds.with_slo(objectives.ttft, objectives.tpot)
    if plan is not None:
        try:
            seqs = int(json.loads(plan.read_text())["flags"]["max_num_seqs"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            _fail(f"--plan {plan}: not `inhouse plan --json` output ({e})")
        thresholds = AlertThresholds(**{**_fields(thresholds), "max_num_seqs": seqs})
    _write(rules_yaml(thresholds), out)


def _fields(thresholds) -> dict:
    return {name: getattr(thresholds, name) for name in thresholds.__dataclass_fields__}


@observe_app.command("prometheus")
def prometheus_command(
    gateway: Annotated[str, typer.Option(help="host:port of the gateway.")] = "127.0.0.1:8000",
    rules_file: Annotated[
        str, typer.Option(help="Path of the rules, as Prometheus sees it.")
    ] = "rules.yml",
    scrape_interval: Annotated[
        str, typer.Option(help="Scrape and rule evaluation interval.")
    ] = "15s",
    out: Annotated[Path | None, typer.Option(help="File to write (default: stdout).")] = None,
    metrics_token_file: Annotated[
        str | None,
        typer.Option(help="File holding the gateway's metrics token, as Prometheus sees it."),
    ] = None,
) -> None:
    """A prometheus.yml scraping the gateway and every backend it routes to."""
    # PyYAML: loaded when the command runs, not with the CLI.
    from inhouse.observe.scrape import prometheus_yaml

    _write(prometheus_yaml(gateway, rules_file, scrape_interval, metrics_token_file), out)


@observe_app.command("dashboard")
def dashboard_command(
    out: Annotated[Path | None, typer.Option(help="File to write (default: stdout).")] = None,
) -> None:
    """The Grafana dashboard JSON (import it, then pick the Prometheus data source)."""
    # PyYAML: loaded when the command runs, not with the CLI.
    from inhouse.observe.dashboard import dashboard

    _write(json.dumps(dashboard(), indent=2) + "\n", out)
