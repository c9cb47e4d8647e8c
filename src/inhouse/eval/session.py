"""One `inhouse eval` run: select items, resolve endpoints, ask them with a progress bar,
then print and write the report."""

from __future__ import annotations

import asyncio
from pathlib import Path

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


def run_eval(
    eval_set: Path | None,
    url: str,
    model: str | None,
    api_key: str | None,
    name: str,
    vs_url: str | None,
    vs_model: str | None,
    vs_api_key: str | None,
    vs_name: str,
    out: Path,
    concurrency: int,
    retries: int,
    temperature: float,
    seed: int,
    timeout: float,
    tag: list[str] | None,
    limit: int | None,
    fresh: bool,
) -> None:
    """What `inhouse eval` does (the command only parses its options)."""
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
