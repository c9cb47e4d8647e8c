"""Each replica's adapters as it lists them itself: every health interval the gateway reads
the `/v1/models` of each replica that is up, and where its cards carry vLLM's `parent` field
(vLLM, `inhouse serve`), the cards whose parent is the replica's `model` are the adapters
routed to it from then on.
So an adapter given to the engine at start but not declared in the config, or loaded or
unloaded through another gateway replica, is routed (or no more) within one interval, and
a replica that restarted without an adapter loaded at run time stops getting its requests.
A replica whose listing says nothing of adapters (no `parent`), or that cannot be read,
keeps what it had (its config's `adapters` at first)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx

from inhouse.api.auth import auth_headers
from inhouse.gateway.backends import Backend, BackendState
from inhouse.gateway.config import HealthSettings


def listed_adapters(answer: Any, base: str) -> set[str] | None:
    """The adapters of `base` a `/v1/models` answer lists (its cards with `base` as their
    parent), or None when no card has a `parent` field: a listing that says nothing of
    adapters."""
    data = answer.get("data") if isinstance(answer, dict) else None
    cards = [c for c in data if isinstance(c, dict)] if isinstance(data, list) else []
    if not any("parent" in c for c in cards):
        return None
    return {c["id"] for c in cards if c.get("parent") == base and isinstance(c.get("id"), str)}


class AdapterSync:
    """Reads the replicas' adapters, one round per health interval."""

    def __init__(
        self, backends: Callable[[], list[Backend]], client: httpx.AsyncClient,
        settings: HealthSettings,
    ) -> None:  # fmt: skip
        self._backends = backends
        self._client = client
        self._settings = settings

    async def run(self) -> None:
        while True:
            await self.sync_all()
            await asyncio.sleep(self._settings.interval_s)

    async def sync_all(self) -> None:
        up = [b for b in self._backends() if b.state is BackendState.UP]
        await asyncio.gather(*(self.sync(b) for b in up))

    async def sync(self, backend: Backend) -> None:
        """Take the replica's own list, unless a load or unload through this gateway
        changed its adapters while the list was on its way (the next round reads again)."""
        changes, upstream = backend.adapter_changes, backend.upstream
        try:
            reply = await self._client.get(
                f"{upstream.url}/v1/models", headers=auth_headers(upstream.api_key),
                timeout=self._settings.timeout_s,
            )  # fmt: skip
            ok = reply.status_code == 200
            listed = listed_adapters(reply.json(), upstream.model) if ok else None
        except (httpx.HTTPError, ValueError):
            return
        if listed is not None and backend.adapter_changes == changes:
            backend.adapters = listed
