"""Backend replicas: their health state, load, and the background checks that set them.

A check asks `/health` first (503 means loading: "starting", not "down"), then makes
a real 1-token inference call with a timeout; `failures_to_down` consecutive failures
mark a backend down and `successes_to_up` successes bring it back. A probe that times out
waiting for its answer after `/health` said 200 is not a failure when the backend's own
`/metrics` shows requests running or waiting: the probe waited in a full queue, the
backend is busy, not dead (its answers' latency and errors are the guardrail's to judge).
A refused or broken connection, a failing `/health`, an error answer, and a timeout on a
backend with nothing to do (or whose load cannot be read) are failures. For inhouse, vLLM,
SGLang and llama.cpp backends it also scrapes `/metrics`, each engine's own names, for
the queue length and KV-cache usage the router uses to pick the least-loaded replica.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

import httpx

from inhouse.api.auth import auth_headers
from inhouse.gateway.affinity import PrefixMemory
from inhouse.gateway.config import HealthSettings, Upstream
from inhouse.http.prometheus import sample_totals
from inhouse.launch import BACKENDS

KV_TENTHS = 10  # KV usage decides between replicas in steps of a tenth (`Backend.load`)


class BackendState(StrEnum):
    UP = "up"
    STARTING = "starting"
    DOWN = "down"


@dataclass(slots=True)
class Backend:
    """One replica of a model as the router sees it."""

    upstream: Upstream
    model: str
    state: BackendState = BackendState.STARTING
    failures: int = 0
    successes: int = 0
    in_flight: int = 0
    waiting: float = 0.0
    kv_usage: float = 0.0
    last_error: str | None = None
    last_check: float | None = None
    picked: int = 0  # when the router last chose it: ties go to the longest unchosen
    draining: bool = False  # sent no new request; its running ones finish (`Router.drain`)
    prefixes: PrefixMemory = field(default_factory=PrefixMemory)  # prompts sent (`affinity`)
    # The LoRA adapters it serves: its config's, then as its own /v1/models lists them
    # (`adapters.sync`) and as loads and unloads through this gateway change them, which
    # `adapter_changes` counts (`adapters.admin`).
    adapters: set[str] = field(init=False)
    adapter_changes: int = 0

    def __post_init__(self) -> None:
        self.adapters = set(self.upstream.adapters)

    @property
    def routable(self) -> bool:
        return (
            self.state is BackendState.UP
            and not self.draining
            and self.in_flight < self.upstream.max_in_flight
        )

    def load(self) -> tuple[float, int, int]:
        """Sort key: requests in flight or waiting per unit of weight, then KV usage in
        tenths (a last scrape's sliver of a cache in use, up to a health interval old, must
        not send every request to the other replica), then the least recently chosen
        (equal replicas take turns)."""
        load = (self.in_flight + self.waiting) / self.upstream.weight
        return (load, int(self.kv_usage * KV_TENTHS), self.picked)

    def record_success(self, settings: HealthSettings) -> bool:
        """Count a good call; returns True if the state changed."""
        self.failures, self.successes, self.last_error = 0, self.successes + 1, None
        if self.state is not BackendState.UP and self.successes >= settings.successes_to_up:
            self.state = BackendState.UP
            return True
        return False

    def record_failure(self, settings: HealthSettings, error: str) -> bool:
        """Count a failed call; returns True if the state changed."""
        self.failures, self.successes, self.last_error = self.failures + 1, 0, error
        if self.state is not BackendState.DOWN and self.failures >= settings.failures_to_down:
            self.state = BackendState.DOWN
            self.prefixes.forget()  # it may come back with an empty cache
            return True
        return False

    def record_busy(self, settings: HealthSettings) -> bool:
        """The probe waited in the backend's full queue: alive. Returns True if the state
        changed."""
        changed = self.record_success(settings)
        self.last_error = "busy: the probe waited in a full queue"
        return changed

    def record_starting(self) -> bool:
        """The backend answered but is still loading its model."""
        self.successes, self.last_error = 0, "loading"
        changed = self.state is not BackendState.STARTING
        self.state = BackendState.STARTING
        if changed:
            self.prefixes.forget()  # a replica that loads again holds no prefix
        return changed

    def describe(self) -> dict[str, object]:
        """What `GET /health` shows: never the backend key."""
        return {
            "name": self.upstream.name,
            "state": self.state.value,
            "in_flight": self.in_flight,
            "draining": self.draining,
            "max_num_seqs": self.upstream.max_num_seqs,
            "waiting": self.waiting,
            "url": self.upstream.url,
            "kv_cache_usage_perc": self.kv_usage,
            "consecutive_failures": self.failures,
            "last_error": self.last_error,
            "adapters": sorted(self.adapters),
            "last_check": self.last_check,
        }


PROBE_TEXT = "ping"  # what a health check asks a backend, its cheapest real call


def probe_request(upstream: Upstream) -> tuple[str, dict[str, object]]:
    """The cheapest real inference call the backend supports."""
    features = upstream.capabilities.features
    if "chat" in features:
        messages = [{"role": "user", "content": PROBE_TEXT}]
        return "chat/completions", {"model": upstream.model, "messages": messages, "max_tokens": 1}
    if "completions" in features:
        return "completions", {"model": upstream.model, "prompt": PROBE_TEXT, "max_tokens": 1}
    return "embeddings", {"model": upstream.model, "input": PROBE_TEXT}


class HealthChecker:
    """Checks every backend (those `backends` returns at each round) each interval and
    tells the router when a state changes."""

    def __init__(
        self,
        backends: Callable[[], list[Backend]],
        client: httpx.AsyncClient,
        settings: HealthSettings,
        on_change: Callable[[Backend], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._backends = backends
        self._client = client
        self._settings = settings
        self._on_change = on_change
        self._clock = clock

    async def run(self) -> None:
        """Check all backends forever, one round per interval."""
        while True:
            await self.check_all()
            await asyncio.sleep(self._settings.interval_s)

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(b) for b in self._backends()))

    async def check(self, backend: Backend) -> None:
        try:
            changed = await self._probe(backend)
        except Exception as exc:  # a check must never kill the loop that runs them all
            changed = backend.record_failure(self._settings, f"check failed: {exc!r}"[:200])
        backend.last_check = self._clock()
        if changed:
            self._on_change(backend)

    async def _probe(self, backend: Backend) -> bool:
        upstream = backend.upstream
        timeout = self._settings.timeout_s
        try:
            health = await self._client.get(f"{upstream.url}/health", timeout=timeout)
            if health.status_code == 503:
                return backend.record_starting()
            path, body = probe_request(upstream)
            reply = await self._client.post(
                f"{upstream.url}/v1/{path}",
                json=body,
                headers=auth_headers(upstream.api_key),  # its own key, never the client's
                timeout=timeout,
            )
        except httpx.ReadTimeout as exc:  # sent, never answered in time: busy or stuck
            if upstream.scraped and await self._busy(backend):
                return backend.record_busy(self._settings)
            return backend.record_failure(self._settings, f"{type(exc).__name__}: {exc}"[:200])
        except httpx.HTTPError as exc:
            return backend.record_failure(self._settings, f"{type(exc).__name__}: {exc}"[:200])
        if reply.status_code != 200:
            return backend.record_failure(
                self._settings, f"probe answered HTTP {reply.status_code}"
            )
        if upstream.scraped:
            await self._scrape(backend)
        return backend.record_success(self._settings)

    async def _scrape(self, backend: Backend) -> str | None:
        """Read the backend's load from its `/metrics`; the page, None if unread."""
        try:
            reply = await self._client.get(
                f"{backend.upstream.url}/metrics",
                headers=auth_headers(backend.upstream.api_key),  # llama.cpp guards /metrics by key
                timeout=self._settings.timeout_s,
            )
        except httpx.HTTPError:
            return None
        if reply.status_code != 200:
            return None
        try:
            backend.waiting, backend.kv_usage = read_load(reply.text, backend.upstream.kind)
        except ValueError:
            backend.last_error = "unreadable /metrics"
            return None
        return reply.text

    async def _busy(self, backend: Backend) -> bool:
        """Whether the backend's own `/metrics` shows requests running or waiting."""
        page = await self._scrape(backend)
        return page is not None and read_busy(page, backend.upstream.kind)


def read_busy(metrics_text: str, kind: str) -> bool:
    """Whether a `/metrics` page in `kind`'s names shows requests running or waiting."""
    names = BACKENDS[kind].metrics
    if names is None:
        return False
    totals = sample_totals(metrics_text)
    return any(totals.get(n, 0.0) > 0 for n in (*names.running, *names.waiting))


def read_load(metrics_text: str, kind: str) -> tuple[float, float]:
    """Requests waiting and KV-cache usage (0–1) from a `/metrics` page in the names
    `kind`'s engine declares (`inhouse.launch.metric_names`)."""
    names = BACKENDS[kind].metrics
    if names is None:
        raise ValueError(f"a {kind} backend has no /metrics to read")
    totals = sample_totals(metrics_text)
    waiting = next((totals[n] for n in names.waiting if n in totals), 0.0)
    return waiting, max((totals.get(n, 0.0) for n in names.kv_usage), default=0.0)
