"""A bench session end to end: check the endpoint, build prompts, run or sweep, report, save."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
from rich.console import Console

from inhouse.api.auth import auth_headers
from inhouse.bench.client import StreamingClient, normalize_base_url
from inhouse.bench.datasets import (
    LengthSpec,
    TokenCounter,
    random_dataset,
    read_jsonl,
    shared_prefix_dataset,
    with_images,
)
from inhouse.bench.loadgen import LoadShape
from inhouse.bench.predicted import Comparison, Prediction, compare
from inhouse.bench.preflight import check_endpoint
from inhouse.bench.progress import BarProgress
from inhouse.bench.report import print_notes, run_table, sweep_table
from inhouse.bench.requests import BenchRequest
from inhouse.bench.results import results_document, write_results
from inhouse.bench.run import RunContext, RunResult, execute_run
from inhouse.bench.settings import DatasetSettings, SessionSettings
from inhouse.bench.sweep import SweepResult, run_sweep, step_sizes
from inhouse.bench.tokenize import ServerTokenCounter, probe_token_counter


async def build_dataset(
    settings: DatasetSettings, count: int, seed: int, counter: TokenCounter | None
) -> list[BenchRequest]:
    """Exactly `count` requests of the chosen dataset (a JSONL file is cycled)."""
    output = LengthSpec(settings.output_len, settings.len_spread)
    if settings.kind == "jsonl":
        assert settings.path is not None
        lines = read_jsonl(settings.path, settings.output_len)
        return [replace(lines[i % len(lines)], index=i) for i in range(count)]
    if settings.kind == "shared-prefix":
        return await shared_prefix_dataset(
            count,
            settings.num_questions,
            settings.prefix_len,
            LengthSpec(settings.input_len, settings.len_spread),
            output,
            seed=seed,
            endpoint=settings.endpoint,
            counter=counter,
            num_prefixes=settings.num_prefixes,
        )
    overhead = 0
    if settings.endpoint == "chat" and isinstance(counter, ServerTokenCounter):
        overhead = await counter.chat_overhead()
    requests = await random_dataset(
        count,
        LengthSpec(settings.input_len, settings.len_spread),
        output,
        seed=seed,
        endpoint=settings.endpoint,
        counter=counter,
        template_overhead=overhead,
    )
    if settings.kind == "random-mm":
        return with_images(requests, settings.images_per_prompt, settings.image_size, seed)
    return requests


@dataclass(slots=True)
class Session:
    """The open clients and what the pre-flight checks learned."""

    context: RunContext
    notes: list[str] = field(default_factory=list)


@contextlib.asynccontextmanager
async def open_session(settings: SessionSettings, console: Console) -> AsyncIterator[Session]:
    """Check the endpoint (raises `EndpointError` before anything is measured), open clients."""
    endpoint = settings.endpoint
    async with httpx.AsyncClient(
        base_url=normalize_base_url(endpoint.base_url),
        headers=auth_headers(endpoint.api_key),
        timeout=httpx.Timeout(30.0, connect=5.0),
    ) as http:
        await check_endpoint(http, endpoint.model)
        counter = await probe_token_counter(http, endpoint.model)
        notes = []
        if counter is None and settings.dataset.kind != "jsonl":
            notes.append("the server has no /tokenize: prompt lengths are word counts, unchecked")
        client = StreamingClient(
            endpoint.base_url,
            endpoint.model,
            api_key=endpoint.api_key,
            timeout=endpoint.timeout,
            sampling=endpoint.sampling(),
        )
        async with client:
            with BarProgress(console) as progress:
                context = RunContext(
                    client=client,
                    http=http,
                    slo=settings.slo,
                    counter=counter,
                    progress=progress,
                    scrape_interval=settings.scrape_interval,
                    metrics_urls=settings.metrics_urls,
                )
                yield Session(context, notes)


async def session_prompts(
    session: Session, settings: SessionSettings, count: int
) -> list[BenchRequest]:
    """The session's prompts, sized with the server's `/tokenize`. When the server refuses
    it part-way (a gateway's rate limit on the bench's key), word counts stand in, as for
    a server without `/tokenize`, and a note says so."""
    try:
        return await build_dataset(settings.dataset, count, settings.seed, session.context.counter)
    except httpx.HTTPStatusError as err:
        session.notes.append(
            f"/tokenize answered {err.response.status_code} while prompts were sized: "
            "prompt lengths are word counts, unchecked"
        )
        return await build_dataset(settings.dataset, count, settings.seed, None)


async def bench_run(settings: SessionSettings, shape: LoadShape, console: Console) -> RunResult:
    """One run; prints the table and writes `results.json` under `settings.out`."""
    async with open_session(settings, console) as session:
        distinct = shape.num_prompts or 256
        pool = await session_prompts(session, settings, settings.warmup + distinct)
        warmup, measured = pool[: settings.warmup], pool[settings.warmup :]
        result = await execute_run(session.context, measured, shape, warmup=warmup)
    console.print(run_table(result))
    print_notes(console, [*session.notes, *result.notes])
    if settings.out is not None:
        document = results_document("run", settings.config_json(), [result], notes=session.notes)
        console.print(f"results: {write_results(document, settings.out)}")
    return result


def _slices(pool: Sequence[BenchRequest], sizes: Sequence[int]) -> list[list[BenchRequest]]:
    slices, offset = [], 0
    for size in sizes:
        slices.append(list(pool[offset : offset + size]))
        offset += size
    return slices


async def bench_sweep(
    settings: SessionSettings,
    steps: Sequence[int],
    predicted: float | None,
    per_slot: int,
    minimum: int,
    console: Console,
    prediction: Prediction | None = None,
) -> SweepResult:
    """A sweep; prints the table and verdict, writes `results.json` and both PNGs under `out`;
    with a `prediction`, also the predicted knee and TPOT beside the measured ones."""
    if settings.slo.ttft is None:
        raise ValueError("a sweep needs a TTFT objective: --slo ttft=…")
    sizes = step_sizes(steps, per_slot, minimum)
    async with open_session(settings, console) as session:
        pool = await session_prompts(session, settings, settings.warmup + sum(sizes))
        result = await run_sweep(
            session.context,
            steps,
            _slices(pool[settings.warmup :], sizes),
            slo_ttft=settings.slo.ttft,
            predicted=predicted,
            base_shape=LoadShape(max_concurrency=1, num_prompts=1, seed=settings.seed),
            warmup=pool[: settings.warmup],
        )
    console.print(sweep_table(result.runs, result.verdict))
    print_notes(console, [*session.notes, *(n for run in result.runs for n in run.notes)])
    comparison = None
    if prediction is not None:
        comparison = compare(prediction, result.runs, result.verdict)
        for line in comparison.lines():
            console.print(line, soft_wrap=True)
    if settings.out is not None:
        save_sweep(settings, result, session.notes, settings.out, console, prediction, comparison)
    return result


def save_sweep(
    settings: SessionSettings,
    result: SweepResult,
    notes: list[str],
    out: Path,
    console: Console,
    prediction: Prediction | None = None,
    comparison: Comparison | None = None,
) -> None:
    """Write `results.json` and the two PNG plots (with the predicted curves when given)."""
    # matplotlib (in plots): loaded only when a sweep is saved.
    from inhouse.bench.plots import plot_sweep

    document = results_document(
        "sweep", settings.config_json(), result.runs, result.verdict, notes=notes
    )
    if prediction is not None and comparison is not None:
        document["prediction"] = {**prediction.to_json(), "comparison": comparison.to_json()}
    console.print(f"results: {write_results(document, out)}")
    curve = prediction.latency.points if prediction is not None else ()
    for path in plot_sweep(result.runs, settings.slo, result.verdict, out, curve):
        console.print(f"plot: {path}")
