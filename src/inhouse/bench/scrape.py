"""Scrape the server's Prometheus `/metrics` while a run goes: KV-cache usage and queue peaks."""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import asdict, dataclass
from typing import Any

import httpx

# Gauge names without their prefix; vLLM's deprecated gpu_cache_usage_perc is read as well.
KV_USAGE_NAMES = ("kv_cache_usage_perc", "gpu_cache_usage_perc")
WAITING_NAMES = ("num_requests_waiting",)
RUNNING_NAMES = ("num_requests_running",)
PREFIXES = ("inhouse:", "vllm:")

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)")


@dataclass(slots=True, frozen=True)
class ServerGauges:
    """One reading of the gauges, summed over label sets; None when the server lacks one."""

    kv_cache_usage: float | None
    waiting: float | None
    running: float | None


def read_gauges(text: str) -> ServerGauges:
    """The gauges found in a Prometheus text exposition, under inhouse or vLLM names."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        name = match.group(1)
        for prefix in PREFIXES:
            if name.startswith(prefix):
                short = name[len(prefix) :]
                with contextlib.suppress(ValueError):
                    totals[short] = totals.get(short, 0.0) + float(match.group(2))
                break

    def first(names: tuple[str, ...]) -> float | None:
        return next((totals[n] for n in names if n in totals), None)

    return ServerGauges(first(KV_USAGE_NAMES), first(WAITING_NAMES), first(RUNNING_NAMES))


def _peak(current: float | None, value: float | None) -> float | None:
    if value is None:
        return current
    return value if current is None else max(current, value)


@dataclass(slots=True)
class GaugePeaks:
    """Highest readings seen during a run; `samples` counts successful scrapes."""

    samples: int = 0
    kv_cache_usage_peak: float | None = None
    waiting_peak: float | None = None
    running_peak: float | None = None
    error: str | None = None

    def add(self, gauges: ServerGauges) -> None:
        """Fold one reading in."""
        self.samples += 1
        self.kv_cache_usage_peak = _peak(self.kv_cache_usage_peak, gauges.kv_cache_usage)
        self.waiting_peak = _peak(self.waiting_peak, gauges.waiting)
        self.running_peak = _peak(self.running_peak, gauges.running)

    def to_json(self) -> dict[str, Any]:
        """Plain data for the results file."""
        return asdict(self)


class MetricsScraper:
    """Polls `GET /metrics` every `interval` seconds inside an `async with` block.

    A server without `/metrics` is noted once and left alone; a failed connection is retried.
    """

    def __init__(self, http: httpx.AsyncClient, interval: float = 0.5) -> None:
        self._http = http
        self._interval = interval
        self._task: asyncio.Task[None] | None = None
        self.peaks = GaugePeaks()

    async def scrape_once(self) -> bool:
        """Take one reading; False when the server has no `/metrics` (not worth asking again)."""
        try:
            response = await self._http.get("/metrics", timeout=5.0)
        except httpx.HTTPError as exc:
            self.peaks.error = f"/metrics unreachable: {type(exc).__name__}"
            return True
        if response.status_code != 200:
            self.peaks.error = f"/metrics answered HTTP {response.status_code}"
            return False
        self.peaks.add(read_gauges(response.text))
        self.peaks.error = None
        return True

    async def _poll(self) -> None:
        while await self.scrape_once():
            await asyncio.sleep(self._interval)

    async def __aenter__(self) -> MetricsScraper:
        self._task = asyncio.create_task(self._poll())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
