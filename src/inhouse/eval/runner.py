"""Run an eval set against one endpoint: a fixed number of requests in flight, answers
stored as they come (resume), a callback per finished item (the progress bar)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx

from inhouse.api.auth import auth_headers
from inhouse.bench.client import normalize_base_url
from inhouse.eval.client import Endpoint, ItemResult, Settings, ask
from inhouse.eval.items import EvalItem
from inhouse.eval.store import ResultStore

OnDone = Callable[[ItemResult], None]


async def run_endpoint(
    items: list[EvalItem],
    endpoint: Endpoint,
    settings: Settings,
    store: ResultStore,
    concurrency: int = 4,
    on_done: OnDone | None = None,
) -> list[ItemResult]:
    """Every item's result on ``endpoint``, in item order; stored answers are reused."""
    results = store.answered(items)
    for result in results.values():
        if on_done is not None:
            on_done(result)
    pending: asyncio.Queue[EvalItem] = asyncio.Queue()
    for item in items:
        if item.id not in results:
            pending.put_nowait(item)

    async def worker(http: httpx.AsyncClient) -> None:
        while not pending.empty():
            item = pending.get_nowait()
            result = await ask(http, endpoint, item, settings)
            store.append(item, result)
            results[item.id] = result
            if on_done is not None:
                on_done(result)

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits) as http:
        await asyncio.gather(*(worker(http) for _ in range(max(1, concurrency))))
    return [results[item.id] for item in items]


async def served_model(url: str, api_key: str | None, timeout_s: float = 30.0) -> str:
    """The first model ``GET /v1/models`` lists (when the user names none)."""
    async with httpx.AsyncClient() as http:
        response = await http.get(
            normalize_base_url(url) + "/v1/models", headers=auth_headers(api_key), timeout=timeout_s
        )
    response.raise_for_status()
    return str(response.json()["data"][0]["id"])
