"""A mixed run: every class of `inhouse.bench.mix` drives the endpoint at once, each with its
own key, shape and tags, and each is summarized on its own."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from rich.console import Console

from inhouse.bench.client import StreamingClient
from inhouse.bench.loadgen import LoadResult, LoadShape, generate_load
from inhouse.bench.metrics import summarize
from inhouse.bench.mix import MAX_SECONDS, MixClass
from inhouse.bench.report import mix_table, print_notes, run_table
from inhouse.bench.requests import BenchRequest, RequestRecord
from inhouse.bench.results import results_document, write_results
from inhouse.bench.run import RunContext, RunResult, warm_up
from inhouse.bench.scrape import MetricsScraper
from inhouse.bench.session import Session, open_session, session_prompts
from inhouse.bench.settings import SessionSettings
from inhouse.bench.tokenize import fill_missing_token_counts

# A background class cycles this many distinct prompts at least (4 per slot otherwise), so
# the prefix cache seldom sees a prompt twice.
BACKGROUND_PROMPTS = 64
COUNTED_BY_TIME_PROMPTS = 256
# Each class's prompts come from their own seed, so classes never share a prefix.
CLASS_SEED_STEP = 1000


@dataclass(slots=True)
class _Lane:
    """One class at run time: its spec, client, prompts and load shape."""

    spec: MixClass
    client: StreamingClient
    warmup: list[BenchRequest]
    measured: list[BenchRequest]
    shape: LoadShape


def class_shape(spec: MixClass, seed: int) -> LoadShape:
    """A closed loop at the class's concurrency; a background class is bounded by a day."""
    duration = MAX_SECONDS if spec.background else spec.duration
    return LoadShape(
        max_concurrency=spec.max_concurrency,
        num_prompts=spec.num_prompts,
        duration=duration,
        seed=seed,
    )


def _pool_size(spec: MixClass) -> int:
    if spec.num_prompts is not None:
        return spec.num_prompts
    if spec.background:
        return max(BACKGROUND_PROMPTS, 4 * spec.max_concurrency)
    return COUNTED_BY_TIME_PROMPTS


async def _lanes(
    session: Session,
    settings: SessionSettings,
    classes: Sequence[MixClass],
    stack: contextlib.AsyncExitStack,
) -> list[_Lane]:
    endpoint = settings.endpoint
    lanes = []
    for i, spec in enumerate(classes):
        dataset = replace(settings.dataset, input_len=spec.input_len, output_len=spec.output_len)
        seed = settings.seed + CLASS_SEED_STEP * i
        own = replace(settings, dataset=dataset, seed=seed)
        pool = await session_prompts(session, own, settings.warmup + _pool_size(spec))
        client = StreamingClient(
            endpoint.base_url,
            endpoint.model,
            api_key=spec.api_key(endpoint.api_key),
            timeout=endpoint.timeout,
            sampling={**endpoint.sampling(), **spec.extra_body()},
        )
        await stack.enter_async_context(client)
        warmup, measured = pool[: settings.warmup], pool[settings.warmup :]
        lanes.append(_Lane(spec, client, warmup, measured, class_shape(spec, seed)))
    return lanes


async def _drive(lanes: Sequence[_Lane], context: RunContext) -> list[LoadResult]:
    """Every lane at once; background lanes stop issuing when the counted ones are done."""
    stop = asyncio.Event()
    counted_total = [lane.spec.num_prompts for lane in lanes if not lane.spec.background]
    total = None if None in counted_total else sum(n or 0 for n in counted_total)
    context.progress.begin("mix: " + ", ".join(lane.spec.name for lane in lanes), total)

    def on_done(spec: MixClass) -> Callable[[RequestRecord], None]:
        def done(record: RequestRecord) -> None:
            if not spec.background:
                context.progress.advance(record)

        return done

    async def lane_load(lane: _Lane) -> LoadResult:
        if lane.spec.delay:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), lane.spec.delay)
        return await generate_load(
            lane.measured, lane.client.send, lane.shape, on_done(lane.spec), stop
        )

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(lane_load(lane)) for lane in lanes]
        counted = [t for t, lane in zip(tasks, lanes, strict=True) if not lane.spec.background]
        await asyncio.wait(counted)
        stop.set()
    return [task.result() for task in tasks]


async def execute_mix(
    session: Session, settings: SessionSettings, classes: Sequence[MixClass]
) -> list[RunResult]:
    """Warm each class up, drive them all at once while scraping `/metrics`, summarize each."""
    context = session.context
    async with contextlib.AsyncExitStack() as stack:
        lanes = await _lanes(session, settings, classes, stack)
        for lane in lanes:
            await warm_up(context, lane.client.send, lane.warmup, lane.spec.name)
        scraping = MetricsScraper(context.http, context.scrape_interval, context.metrics_urls)
        async with scraping as scraper:
            loads = await _drive(lanes, context)
    results = []
    for lane, load in zip(lanes, loads, strict=True):
        note = await fill_missing_token_counts(load.records, context.counter)
        results.append(
            RunResult(
                shape=lane.shape,
                summary=summarize(load.records, load.duration, context.slo),
                records=load.records,
                server=scraper.readings,
                warmup_requests=len(lane.warmup),
                notes=[f"{lane.spec.name}: {note}"] if note else [],
                traffic_class=lane.spec.to_json(),
            )
        )
    return results


async def bench_mix(
    settings: SessionSettings, classes: Sequence[MixClass], console: Console
) -> list[RunResult]:
    """A mixed run; prints each class's table and the side-by-side one, writes `results.json`.
    The pre-flight checks use the run's key, else the first class's."""
    key = settings.endpoint.api_key or classes[0].api_key(None)
    checked = replace(settings, endpoint=replace(settings.endpoint, api_key=key))
    async with open_session(checked, console) as session:
        results = await execute_mix(session, settings, classes)
    for result in results:
        assert result.traffic_class is not None
        console.print(run_table(result, title=f"inhouse bench · {result.traffic_class['name']}"))
    console.print(mix_table(results))
    print_notes(console, [*session.notes, *(n for r in results for n in r.notes)])
    if settings.out is not None:
        config = {**settings.config_json(), "mix": [c.to_json() for c in classes]}
        document = results_document("mix", config, results, notes=session.notes)
        console.print(f"results: {write_results(document, settings.out)}")
    return results
