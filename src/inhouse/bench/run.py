"""One benchmark run: warm up, drive the load while scraping `/metrics`, summarize."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from inhouse.bench.client import StreamingClient
from inhouse.bench.loadgen import LoadShape, Sender, generate_load
from inhouse.bench.metrics import RunSummary, Slo, summarize
from inhouse.bench.requests import BenchRequest, RequestRecord
from inhouse.bench.scrape import MetricsScraper, ServerReadings
from inhouse.bench.tokenize import ServerTokenCounter, fill_missing_token_counts


class Progress(Protocol):
    """Where a run reports its progress (a rich bar on the console; nothing in tests)."""

    def begin(self, description: str, total: int | None) -> None:
        """A phase with `total` requests (None: bounded by time) starts."""

    def advance(self, record: RequestRecord) -> None:
        """One request finished."""


class NoProgress:
    """Progress that shows nothing."""

    def begin(self, description: str, total: int | None) -> None:
        """Ignore the phase."""

    def advance(self, record: RequestRecord) -> None:
        """Ignore the request."""


@dataclass(slots=True)
class RunResult:
    """The outcome of one run: its load shape, summary, every record and the server's peaks."""

    shape: LoadShape
    summary: RunSummary
    records: list[RequestRecord]
    server: ServerReadings
    warmup_requests: int = 0
    notes: list[str] = field(default_factory=list)
    traffic_class: dict[str, Any] | None = None  # a mixed run's class (`inhouse.bench.mix`)

    def to_json(self) -> dict[str, Any]:
        """Plain data for the results file (see `inhouse.bench.schema`)."""
        labelled = {} if self.traffic_class is None else {"class": self.traffic_class}
        return {
            **labelled,
            "max_concurrency": self.shape.max_concurrency,
            "request_rate": self.shape.request_rate,
            "burstiness": self.shape.burstiness,
            "warmup_requests": self.warmup_requests,
            "summary": self.summary.to_json(),
            "server_metrics": self.server.to_json(),
            "notes": list(self.notes),
            "requests": [r.to_json() for r in sorted(self.records, key=lambda r: r.index)],
        }


@dataclass(slots=True)
class RunContext:
    """What every run of a session shares: the streaming client, a plain HTTP client, the SLO."""

    client: StreamingClient
    http: httpx.AsyncClient
    slo: Slo
    counter: ServerTokenCounter | None = None
    progress: Progress = field(default_factory=NoProgress)
    scrape_interval: float = 0.5
    metrics_urls: tuple[str, ...] = ()  # servers to read /metrics of, else the base URL


async def warm_up(
    context: RunContext, send: Sender, warmup: Sequence[BenchRequest], label: str
) -> None:
    """Send the `warmup` requests unmeasured, at most 8 in flight."""
    if not warmup:
        return
    shape = LoadShape(max_concurrency=min(len(warmup), 8), num_prompts=len(warmup))
    context.progress.begin(f"{label}: warm-up", len(warmup))
    await generate_load(warmup, send, shape, context.progress.advance)


async def execute_run(
    context: RunContext,
    requests: Sequence[BenchRequest],
    shape: LoadShape,
    *,
    warmup: Sequence[BenchRequest] = (),
    label: str = "run",
) -> RunResult:
    """Send the `warmup` requests unmeasured, then the measured load; always returns a result.

    Warm-up prompts should differ from the measured ones, or the prefix cache flatters TTFT.
    """
    await warm_up(context, context.client.send, warmup, label)
    context.progress.begin(label, shape.num_prompts)
    scraping = MetricsScraper(context.http, context.scrape_interval, context.metrics_urls)
    async with scraping as scraper:
        load = await generate_load(requests, context.client.send, shape, context.progress.advance)
    notes = []
    note = await fill_missing_token_counts(load.records, context.counter)
    if note:
        notes.append(note)
    return RunResult(
        shape=shape,
        summary=summarize(load.records, load.duration, context.slo),
        records=load.records,
        server=scraper.readings,
        warmup_requests=len(warmup),
        notes=notes,
    )
