"""Scrape the server's Prometheus `/metrics` while a run goes: KV-cache usage and queue peaks,
prefix-cache hit rate and preemptions over the run, and speculative decoding's counters.
Behind a gateway, whose `/metrics` has no engine's series, the replicas' own pages
(`--metrics-url`, once per replica) are read instead and added up."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import asdict, dataclass, fields
from typing import Any

import httpx

from inhouse.http.prometheus import sample_totals
from inhouse.launch import BACKENDS

# The engines' names, by meaning (`inhouse.launch.metric_names`).
ENGINE_METRICS = tuple(b.metrics for b in BACKENDS.values() if b.metrics is not None)


@dataclass(slots=True, frozen=True)
class ServerReading:
    """One scrape, summed over label sets; None where the server lacks the series."""

    kv_cache_usage: float | None
    waiting: float | None
    running: float | None
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    preemptions: float | None = None
    spec_drafts: float | None = None
    spec_draft_tokens: float | None = None
    spec_accepted_tokens: float | None = None
    images_encoded: float | None = None
    image_encode_seconds: float | None = None


def read_gauges(text: str) -> ServerReading:
    """The series found in a Prometheus text exposition, under any engine's names;
    ValueError if the page is not a valid exposition."""
    totals = sample_totals(text)

    def first(meaning: str) -> float | None:
        """The first series of that meaning found (a counter's samples end in `_total`)."""
        for names in ENGINE_METRICS:
            for name in getattr(names, meaning):
                for sample in (f"{name}_total", name):
                    if sample in totals:
                        return totals[sample]
        return None

    return ServerReading(
        first("kv_usage"),
        first("waiting"),
        first("running"),
        first("prefix_queries"),
        first("prefix_hits"),
        first("preemptions"),
        first("spec_drafts"),
        first("spec_draft_tokens"),
        first("spec_accepted_tokens"),
        first("images_encoded"),
        first("image_encode_seconds"),
    )


def combined(readings: list[ServerReading]) -> ServerReading:
    """Several replicas' readings as one server's: counters and queues added up, the
    fullest KV cache for KV-cache usage; None where no replica has the series."""

    def total(name: str) -> float | None:
        values = [v for v in (getattr(r, name) for r in readings) if v is not None]
        if not values:
            return None
        return max(values) if name == "kv_cache_usage" else sum(values)

    return ServerReading(**{f.name: total(f.name) for f in fields(ServerReading)})


def _peak(current: float | None, value: float | None) -> float | None:
    if value is None:
        return current
    return value if current is None else max(current, value)


def _delta(first: float | None, last: float | None) -> float | None:
    return None if first is None or last is None else last - first


@dataclass(slots=True)
class ServerReadings:
    """What the scrapes of one run saw: gauge peaks, and counter growth from first to last."""

    samples: int = 0
    kv_cache_usage_peak: float | None = None
    waiting_peak: float | None = None
    running_peak: float | None = None
    first: ServerReading | None = None
    last: ServerReading | None = None
    error: str | None = None

    def add(self, reading: ServerReading) -> None:
        """Fold one reading in."""
        self.samples += 1
        self.kv_cache_usage_peak = _peak(self.kv_cache_usage_peak, reading.kv_cache_usage)
        self.waiting_peak = _peak(self.waiting_peak, reading.waiting)
        self.running_peak = _peak(self.running_peak, reading.running)
        self.first = self.first or reading
        self.last = reading

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Prompt tokens found in the prefix cache ÷ prompt tokens looked up, during the run."""
        queries, hits = self._growth("prefix_queries"), self._growth("prefix_hits")
        return None if not queries or hits is None else hits / queries

    def _growth(self, counter: str) -> float | None:
        """How much a counter of ServerReading grew from the first scrape to the last."""
        if self.first is None or self.last is None:
            return None
        return _delta(getattr(self.first, counter), getattr(self.last, counter))

    @property
    def preemptions(self) -> float | None:
        """Sequences the server preempted for want of KV blocks during the run."""
        return self._growth("preemptions")

    @property
    def images_encoded(self) -> float | None:
        """Images the server's vision encoder ran over during the run (ours reports it)."""
        return self._growth("images_encoded")

    @property
    def image_encode_seconds(self) -> float | None:
        """The seconds those encodings took."""
        return self._growth("image_encode_seconds")

    def to_json(self) -> dict[str, Any]:
        """Plain data for the results file."""
        data = asdict(self)
        del data["first"], data["last"]
        data["prefix_cache_hit_rate"] = self.prefix_cache_hit_rate
        data["preemptions"] = self.preemptions
        data["images_encoded"] = self.images_encoded
        data["image_encode_seconds"] = self.image_encode_seconds
        return data


class MetricsScraper:
    """Polls `GET /metrics` every `interval` seconds inside an `async with` block, and once
    more on leaving it so counters cover the whole run: the base URL's, or each of `urls`
    (servers' roots) added up (`combined`).

    A server without `/metrics` is noted once and left alone; a failed connection is retried
    (a round where one of `urls` fails is skipped: its counters would drop out of the sum).
    """

    def __init__(
        self, http: httpx.AsyncClient, interval: float = 0.5, urls: tuple[str, ...] = ()
    ) -> None:
        self._http = http
        self._interval = interval
        self._pages = [f"{u.rstrip('/').removesuffix('/metrics')}/metrics" for u in urls]
        self._task: asyncio.Task[None] | None = None
        self._missing = False
        self.readings = ServerReadings()

    async def scrape_once(self) -> None:
        """Take one reading (unless a server has no `/metrics`)."""
        if self._missing:
            return
        try:
            responses = await asyncio.gather(
                *(self._http.get(page, timeout=5.0) for page in self._pages or ["/metrics"])
            )
        except httpx.HTTPError as exc:
            self.readings.error = f"/metrics unreachable: {type(exc).__name__}"
            return
        refused = next((r for r in responses if r.status_code != 200), None)
        if refused is not None:
            self.readings.error = f"{refused.url} answered HTTP {refused.status_code}"
            self._missing = True
            return
        try:
            self.readings.add(combined([read_gauges(r.text) for r in responses]))
        except ValueError:
            self.readings.error = "/metrics is not a Prometheus text exposition"
            return
        self.readings.error = None

    async def _poll(self) -> None:
        while not self._missing:
            await asyncio.sleep(self._interval)
            await self.scrape_once()

    async def __aenter__(self) -> MetricsScraper:
        await self.scrape_once()  # the counters' baseline, before any request is sent
        self._task = asyncio.create_task(self._poll())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.scrape_once()
