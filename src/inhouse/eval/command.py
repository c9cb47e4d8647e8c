"""``inhouse eval``: run an eval set against one endpoint, or two and compare them.

Only the options live here; the run (HTTP client, graders, report) is imported when the
command runs, so other subcommands start without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def eval_command(
    eval_set: Annotated[
        Path | None, typer.Argument(help="JSONL eval set (default: the starter set shipped).")
    ] = None,
    url: Annotated[
        str, typer.Option("--base-url", help="First endpoint (A), as `bench` takes it.")
    ] = "http://127.0.0.1:8000",
    old_url: Annotated[str | None, typer.Option("--url", hidden=True)] = None,
    model: Annotated[str | None, typer.Option(help="Model at A (default: its first).")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="OPENAI_API_KEY", help="Key for A.")] = None,
    name: Annotated[str, typer.Option(help="Label of A in the report.")] = "A",
    vs_url: Annotated[
        str | None, typer.Option("--vs-base-url", help="Second endpoint (B).")
    ] = None,
    old_vs_url: Annotated[str | None, typer.Option("--vs-url", hidden=True)] = None,
    vs_model: Annotated[str | None, typer.Option(help="Model at B (default: its first).")] = None,
    vs_api_key: Annotated[str | None, typer.Option(help="Key for B (default: A's).")] = None,
    vs_name: Annotated[str, typer.Option(help="Label of B in the report.")] = "B",
    out: Annotated[Path, typer.Option(help="Folder for answers, report.json and the PNG.")] = Path(
        "eval-out"
    ),
    concurrency: Annotated[int, typer.Option(min=1, help="Requests in flight per endpoint.")] = 4,
    retries: Annotated[int, typer.Option(min=0, help="Retries on 429/503/dropped link.")] = 5,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Seed sent with every request.")] = 0,
    timeout: Annotated[float, typer.Option(help="Seconds per request.")] = 120.0,
    tag: Annotated[list[str] | None, typer.Option(help="Only items with this tag.")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="Only the first N items.")] = None,
    fresh: Annotated[bool, typer.Option(help="Ask again, ignoring stored answers.")] = False,
) -> None:
    """Run an eval set against an endpoint (or two: the paired comparison, McNemar, flips).

    `--url` and `--vs-url` are kept, hidden, for the commands written before `--base-url`.
    """
    # httpx, rich, jsonschema: loaded when the command runs, not with the CLI.
    from inhouse.eval.session import run_eval

    run_eval(
        eval_set,
        old_url or url,
        model,
        api_key,
        name,
        old_vs_url or vs_url,
        vs_model,
        vs_api_key,
        vs_name,
        out,
        concurrency,
        retries,
        temperature,
        seed,
        timeout,
        tag,
        limit,
        fresh,
    )
