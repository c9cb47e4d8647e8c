"""``inhouse eval``: run an eval set against one endpoint, or two and compare them."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from inhouse.eval.client import Endpoint, ItemResult, Settings
from inhouse.eval.compare import compare, summarize
from inhouse.eval.items import EvalItem, EvalSetError, load_eval_set, starter_set
from inhouse.eval.plot import ACCURACY_PNG, plot_accuracy
from inhouse.eval.report import EvalReport, print_report
from inhouse.eval.runner import run_endpoint, served_model
from inhouse.eval.store import ResultStore

EXIT_BAD_INPUT = 2
EXIT_UNREACHABLE = 1


def eval_command(
    eval_set: Annotated[
        Path | None, typer.Argument(help="JSONL eval set (default: the starter set shipped).")
    ] = None,
    url: Annotated[str, typer.Option(help="First endpoint (A).")] = "http://127.0.0.1:8000",
    model: Annotated[str | None, typer.Option(help="Model at A (default: its first).")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="OPENAI_API_KEY", help="Key for A.")] = None,
    name: Annotated[str, typer.Option(help="Label of A in the report.")] = "A",
    vs_url: Annotated[str | None, typer.Option(help="Second endpoint (B) to compare.")] = None,
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
    """Run an eval set against an endpoint (or two: the paired comparison, McNemar, flips)."""
    path = eval_set or starter_set()
    try:
        items = select(load_eval_set(path), tag, limit)
    except (OSError, EvalSetError) as err:
        typer.echo(f"inhouse eval: {err}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    settings = Settings(temperature=temperature, seed=seed, timeout_s=timeout, retries=retries)
    targets = [(name, url, model, api_key)]
    if vs_url is not None:
        if vs_name == name:
            typer.echo("inhouse eval: --name and --vs-name must differ", err=True)
            raise typer.Exit(EXIT_BAD_INPUT)
        targets.append((vs_name, vs_url, vs_model, vs_api_key or api_key))
    out.mkdir(parents=True, exist_ok=True)
    endpoints = [_resolved(*target) for target in targets]
    console = Console(stderr=True)
    results = [
        run_with_progress(items, e, settings, out, concurrency, fresh, console) for e in endpoints
    ]
    summaries = [summarize(e, items, r) for e, r in zip(endpoints, results, strict=True)]
    report = EvalReport(
        str(path), items, summaries, results, compare(*results) if len(results) == 2 else None
    )
    print_report(report, Console())
    written = [report.write_json(out), plot_accuracy(summaries, out / ACCURACY_PNG)]
    typer.echo("wrote " + ", ".join(str(p) for p in written))


def select(items: list[EvalItem], tags: list[str] | None, limit: int | None) -> list[EvalItem]:
    """The items with any of ``tags`` (all without), then the first ``limit``."""
    chosen = [i for i in items if not tags or set(tags) & set(i.tags)]
    if not chosen:
        raise EvalSetError(f"no item has the tag(s) {', '.join(tags or [])}")
    return chosen[:limit] if limit else chosen


def _resolved(name: str, url: str, model: str | None, api_key: str | None) -> Endpoint:
    """The endpoint, asking ``/v1/models`` for the model when none is named."""
    if model is None:
        try:
            model = asyncio.run(served_model(url, api_key))
        except (httpx.HTTPError, LookupError, ValueError) as err:
            typer.echo(f"inhouse eval: cannot list the models at {url}: {err}", err=True)
            raise typer.Exit(EXIT_UNREACHABLE) from None
    return Endpoint(name, url, model, api_key)


def run_with_progress(
    items: list[EvalItem],
    endpoint: Endpoint,
    settings: Settings,
    out: Path,
    concurrency: int,
    fresh: bool,
    console: Console,
) -> list[ItemResult]:
    """One endpoint's run with a progress bar (answers done, errors so far)."""
    store = ResultStore(out, endpoint, settings)
    if fresh:
        store.path.unlink(missing_ok=True)
    bar = Progress(
        TextColumn(f"{endpoint.name} {endpoint.model}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("errors {task.fields[errors]}"),
        TimeElapsedColumn(),
        console=console,
    )
    task = bar.add_task(endpoint.name, total=len(items), errors=0)
    errors = 0

    def done(result: ItemResult) -> None:
        nonlocal errors
        errors += result.error is not None
        bar.update(task, advance=1, errors=errors)

    with bar:
        return asyncio.run(run_endpoint(items, endpoint, settings, store, concurrency, done))
