"""The gateway of the release tests, in process: the real app over ASGI, a real SQLite file,
and the canned upstreams of `canned_upstream` on loopback sockets as its backends (the
stable answers "Hi!", the candidate "Yo!", so each answer says which release gave it)."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
from canned_upstream import Canned
from sqlalchemy import select

from inhouse.gateway.access_log import AccessLog
from inhouse.gateway.app import build_gateway, create_app
from inhouse.gateway.audit.writer import recent_rows
from inhouse.gateway.config_file import parse_config
from inhouse.gateway.db import shadow_pairs
from inhouse.gateway.handler import Gateway
from inhouse.gateway.releases.store import BackendRef, Guardrails, NewRelease

HELLO = [{"role": "user", "content": "hello"}]
STABLE, CANDIDATE = "Hi!", "Yo!"


@dataclass
class Env:
    gateway: Gateway
    http: httpx.AsyncClient
    log: io.StringIO
    db_url: str

    def client(self, secret: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url="http://gateway/v1", api_key=secret, http_client=self.http, max_retries=0
        )

    def key(self, name: str, **limits: Any) -> str:
        return self.gateway.keys.create(name, **limits)[1]

    def canary(self, url: str, percent: float, shadow: float = 0.0, **guard: Any) -> None:
        candidate = NewRelease(
            (BackendRef.parse(url, kind="vllm"),), guardrails=Guardrails(**guard)
        )
        first = NewRelease((BackendRef("stable"),))
        self.gateway.releases.store.canary("m", first, candidate, percent, shadow, "test", None)

    async def ask(self, secret: str, messages: Any = HELLO, **extra: Any) -> str:
        answer = await self.client(secret).chat.completions.create(
            model="m", messages=messages, **extra
        )
        return answer.choices[0].message.content or ""

    async def ask_streamed(self, secret: str, messages: Any = HELLO, **extra: Any) -> str:
        stream = await self.client(secret).chat.completions.create(
            model="m", messages=messages, stream=True, **extra
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    async def rows(self, key_name: str) -> list[dict[str, Any]]:
        await self.gateway.audit.flush()
        return recent_rows(self.gateway.releases.store.db, 1000, key_name)[::-1]

    async def pairs(self) -> list[dict[str, Any]]:
        await self.gateway.shadow.flush()
        with self.gateway.releases.store.db.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(select(shadow_pairs))]

    def metric(self, name: str, **labels: str) -> float:
        value = self.gateway.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


def run_gateway(
    tmp_path: Path, stable: Canned, test: Callable[[Env], Awaitable[None]], **rel: Any
) -> None:
    db_url = f"sqlite:///{tmp_path / 'gateway.db'}"
    backend = {"name": "stable", "url": stable.url, "model": "up", "kind": "vllm",
               "capabilities": ["chat", "completions", "json_schema", "tools"]}  # fmt: skip
    config = parse_config(
        {
            "gateway": {"database": db_url},
            "releases": rel,
            "models": [{"name": "m", "backends": [backend], "queue_max_wait_s": 0.5}],
        }
    )
    gateway = build_gateway(config)
    for backend_state in gateway.router.all_backends():
        backend_state.record_success(config.health)
    log = io.StringIO()

    async def main() -> None:
        transport = httpx.ASGITransport(create_app(gateway, AccessLog(log)))
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            try:
                await test(Env(gateway, http, log, db_url))
            finally:
                await gateway.drain()
                await gateway.upstreams.aclose()

    asyncio.run(main())
