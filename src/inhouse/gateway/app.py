"""The gateway's app: wires the key store, limiter, router, health checks, audit writer
and metrics together; the OpenAI routes are served by `GatewayFront`, the rest by FastAPI."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from inhouse.api.models import ModelCard, ModelList
from inhouse.gateway.access_log import AccessLog
from inhouse.gateway.adapters.admin import install_adapter_admin
from inhouse.gateway.adapters.served import served
from inhouse.gateway.adapters.sync import AdapterSync
from inhouse.gateway.audit.writer import AuditWriter
from inhouse.gateway.backends import Backend, HealthChecker
from inhouse.gateway.config import GatewayConfig, default_state_dir
from inhouse.gateway.console.install import install_console
from inhouse.gateway.db import sqlite_path
from inhouse.gateway.db_open import open_database
from inhouse.gateway.exchange import UpstreamClients
from inhouse.gateway.front import GatewayFront
from inhouse.gateway.handler import Gateway
from inhouse.gateway.holds import HoldStore
from inhouse.gateway.keys import KeyStore, load_pepper, may_scrape, public_health, scrape_refused
from inhouse.gateway.limits import Gcra, KeyLimiter, LimitCalls, MemoryTatStore, SqlTatStore
from inhouse.gateway.metrics import GatewayMetrics, scrape_targets
from inhouse.gateway.openapi import install_openapi
from inhouse.gateway.releases.guardrail import Guardrail
from inhouse.gateway.releases.store import ReleaseStore
from inhouse.gateway.routing import Router
from inhouse.gateway.state import GatewayState
from inhouse.gateway.usage.teams import TeamStore
from inhouse.http.body_limit import BodySizeLimit
from inhouse.http.errors import install_error_handlers


def build_gateway(config: GatewayConfig, clock: Callable[[], float] = time.time) -> Gateway:
    """Open the database and build the gateway's state objects from a config."""
    db = open_database(config.database)
    keys = KeyStore(db, load_pepper(config), clock)
    store = SqlTatStore(db) if config.shared_limits else MemoryTatStore()
    holds = HoldStore(db, config.cost.charged, config.hold_ttl_s, clock)
    state = GatewayState(
        config=config,
        db=db,
        keys=keys,
        limiter=KeyLimiter(Gcra(store, clock)),
        limits=LimitCalls(config.shared_limits),
        router=Router(config.models, config.health.interval_s),
        upstreams=UpstreamClients(),
        teams=TeamStore(db, clock),
        holds=holds,
        audit=AuditWriter(db, config.audit, journal_dir(config), holds.settle_rows),
        metrics=GatewayMetrics(config.audit.creep_window, [m.name for m in config.models]),
    )
    return Gateway(state, ReleaseStore(db, clock))


def journal_dir(config: GatewayConfig) -> Path:
    """`audit.journal_dir`, else `<database file>.audit` beside SQLite, else the state dir."""
    if config.audit.journal_dir is not None:
        return config.audit.journal_dir
    db_file = sqlite_path(config.database)
    if db_file is None:
        return default_state_dir() / "audit-journal"
    return db_file.with_name(db_file.name + ".audit")


Background = Callable[[Gateway], Coroutine[Any, Any, None]]  # a loop run beside the gateway


def create_app(
    gateway: Gateway, access_log: AccessLog | None = None, background: Sequence[Background] = ()
) -> BodySizeLimit:
    """The ASGI app over a built Gateway; background tasks run for the app's lifetime,
    with each of `background` (`inhouse up`'s autoscaler) on the gateway's event loop.

    Bodies over `max_request_body` get 413 before anything reads or authenticates them
    (so they are not in the access log)."""

    def on_health_change(backend: Backend) -> None:
        gateway.router.wake(backend.model)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        health_client = httpx.AsyncClient()
        checker = HealthChecker(
            gateway.router.all_backends, health_client, gateway.config.health, on_health_change
        )
        guardrail = Guardrail(
            gateway.releases.store, gateway.release_metrics, gateway.releases.candidates,
            gateway.config.releases.guard_interval_s,
        )  # fmt: skip
        adapters = AdapterSync(gateway.router.all_backends, health_client, gateway.config.health)
        loops = (checker.run(), adapters.run(), gateway.audit.run(), guardrail.run(),
                 gateway.state.holds.run(), *(loop(gateway) for loop in background))  # fmt: skip
        tasks = [asyncio.create_task(loop) for loop in loops]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await gateway.drain()
            await gateway.audit.close()
            await health_client.aclose()
            await gateway.upstreams.aclose()
            if access_log is not None:
                access_log.flush()

    app = FastAPI(title="inhouse gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    install_error_handlers(app)
    install_openapi(app)
    install_console(app, gateway)

    install_adapter_admin(app, gateway)

    @app.get("/v1/models")
    async def models(request: Request) -> ModelList:
        """The models the key may use, then the adapters, each with its base as `parent`."""
        key = await gateway.authenticate(request.headers.getlist("authorization"))
        now = int(time.time())
        bases = [r.name for r in gateway.config.models if key.may_use(r.name)]
        adapters = {a: base for a, base in served(gateway.router).items() if base in bases}
        usable = await gateway.adapters.usable(key, adapters)
        cards = [ModelCard(id=name, created=now) for name in bases]
        cards += [ModelCard(id=a, created=now, parent=adapters[a]) for a in usable]
        return ModelList(data=cards)

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        status, body = gateway.router.health()
        if not may_scrape(gateway.config, request):
            body = public_health(body)
        return JSONResponse(body, status_code=status)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        if not may_scrape(gateway.config, request):
            return scrape_refused()
        gateway.metrics.observe_backends(gateway.router.all_backends())
        for name in gateway.router.routes:
            gateway.metrics.queue_depth.labels(name).set(gateway.router.queue_depth(name))
            gateway.metrics.observe_replicas(name, gateway.router.replicas(name))
        gateway.metrics.observe_teams(await asyncio.to_thread(gateway.teams.list), time.time())
        return Response(gateway.metrics.exposition(), media_type="text/plain; version=0.0.4")

    @app.get("/metrics/targets")
    async def metrics_targets(request: Request) -> Response:
        """The backends' /metrics for Prometheus' HTTP service discovery (no keys in it)."""
        if not may_scrape(gateway.config, request):
            return scrape_refused()
        return JSONResponse(scrape_targets(gateway.router.all_backends()))

    return BodySizeLimit(GatewayFront(gateway, app, access_log), gateway.config.max_request_body)
