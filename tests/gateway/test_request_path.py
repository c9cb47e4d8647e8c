"""The gateway's request path in process: the real app over ASGI, the real SQLite key store
and audit table, and a canned upstream on a loopback socket."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from canned_upstream import USAGE, Canned

from inhouse.gateway.app import build_gateway, create_app
from inhouse.gateway.audit.writer import recent_rows
from inhouse.gateway.backends import HealthChecker
from inhouse.gateway.config_file import parse_config
from inhouse.gateway.db_open import open_database
from inhouse.gateway.handler import Gateway

HELLO = [{"role": "user", "content": "hello"}]


@dataclass
class Env:
    """One gateway built for a test, its ASGI client, and the upstream behind it."""

    gateway: Gateway
    http: httpx.AsyncClient
    canned: Canned
    db_url: str

    def client(self, secret: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url="http://gateway/v1", api_key=secret, http_client=self.http, max_retries=0
        )

    def key(self, name: str, **limits: Any) -> str:
        return self.gateway.keys.create(name, **limits)[1]

    async def rows(self, key_name: str | None = None) -> list[dict[str, Any]]:
        await self.gateway.audit.flush()
        db = open_database(self.db_url)
        try:
            return recent_rows(db, 100, key_name)[::-1]
        finally:
            db.dispose()


def _run(tmp_path: Path, canned: Canned, test: Callable[[Env], Awaitable[None]]) -> None:
    """Build a gateway in front of `canned` (model "m") and of a port nobody listens on
    (model "dead"), check its backends once, and run `test` against it."""
    backend = {"name": "r1", "url": canned.url, "api_key": "upstream-key", "model": "up-model"}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    dead = {"name": "gone", "url": dead_url, "model": "up-model"}
    db_url = f"sqlite:///{tmp_path / 'gateway.db'}"
    config = parse_config(
        {
            "gateway": {"database": db_url},
            "models": [
                {"name": "m", "backends": [{**backend, "kind": "vllm"}]},
                {"name": "dead", "backends": [dead], "queue_max_wait_s": 0.2},
            ],
        }
    )
    gateway = build_gateway(config)

    async def main() -> None:
        async with httpx.AsyncClient() as health:
            checker = HealthChecker(
                gateway.router.all_backends, health, config.health, lambda _: None
            )
            await checker.check_all()
        transport = httpx.ASGITransport(create_app(gateway))
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            try:
                await test(Env(gateway, http, canned, db_url))
            finally:
                await gateway.drain()
                await gateway.upstreams.aclose()

    asyncio.run(main())


def test_a_call_reaches_the_upstream_rewritten_and_is_audited(
    tmp_path: Path, canned: Canned
) -> None:
    async def test(env: Env) -> None:
        secret = env.key("alice", rpm=100)
        answer = await env.client(secret).chat.completions.create(model="m", messages=HELLO)
        assert answer.choices[0].message.content == "Hi!"
        headers, body = env.canned.last()
        assert headers["authorization"] == "Bearer upstream-key"  # key exchange
        assert body["model"] == "up-model" and body["max_tokens"] == 1024
        assert len(body["cache_salt"]) > 0
        (row,) = await env.rows("alice")
        assert (row["status"], row["backend"], row["stream"]) == (200, "r1", False)
        assert (row["prompt_tokens"], row["completion_tokens"]) == (9, 2)
        assert env.gateway.limiter.in_flight(env.gateway.keys.get("alice")) == 0

    _run(tmp_path, canned, test)


@pytest.mark.parametrize("include_usage", [False, True])
def test_a_stream_is_relayed_and_charged_its_real_usage(
    tmp_path: Path, canned: Canned, include_usage: bool
) -> None:
    async def test(env: Env) -> None:
        client = env.client(env.key("bob"))
        options = {"include_usage": True} if include_usage else None
        stream = await client.chat.completions.create(
            model="m", messages=HELLO, stream=True, stream_options=options
        )
        chunks = [c async for c in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "Hi!"
        usage = [c.usage.model_dump(exclude_none=True) for c in chunks if c.usage]
        assert usage == ([USAGE] if include_usage else [])
        assert env.canned.last()[1]["stream_options"] == {"include_usage": True}
        (row,) = await env.rows("bob")
        assert (row["status"], row["stream"], row["completion_tokens"]) == (200, True, 2)
        assert row["finish_reason"] == "length" and row["ttft_ms"] is not None

    _run(tmp_path, canned, test)


def test_refusals_before_admission_are_openai_errors_and_audited(
    tmp_path: Path, canned: Canned
) -> None:
    async def test(env: Env) -> None:
        received = len(env.canned.asked())
        no_key = await env.http.post("/v1/chat/completions", json={"model": "m"})
        assert no_key.status_code == 401
        assert no_key.json()["error"]["code"] == "invalid_api_key"
        secret = env.key("carol")
        client = env.client(secret)
        with pytest.raises(openai.NotFoundError) as unknown:
            await client.chat.completions.create(model="nope", messages=HELLO)
        assert unknown.value.code == "model_not_found"
        with pytest.raises(openai.BadRequestError) as gap:
            await client.embeddings.create(model="m", input="x")
        assert gap.value.code == "unsupported_capability"
        auth = {"Authorization": f"Bearer {secret}"}
        junk = await env.http.post("/v1/chat/completions", content=b"{", headers=auth)
        assert junk.status_code == 400 and junk.json()["error"]["type"] == "invalid_request_error"
        wrong_method = await env.http.get("/v1/chat/completions", headers=auth)
        assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"
        statuses = [r["status"] for r in await env.rows()]
        assert statuses == [401, 404, 400, 400]
        assert len(env.canned.asked()) == received  # nothing refused reached the upstream

    _run(tmp_path, canned, test)


def test_a_rate_limited_key_gets_429_with_retry_after_and_its_slot_back(
    tmp_path: Path, canned: Canned
) -> None:
    async def test(env: Env) -> None:
        client = env.client(env.key("dave", rpm=1))
        await client.chat.completions.create(model="m", messages=HELLO, max_tokens=1)
        with pytest.raises(openai.RateLimitError) as limited:
            await client.chat.completions.create(model="m", messages=HELLO, max_tokens=1)
        assert limited.value.code == "rate_limit_exceeded"
        assert int(limited.value.response.headers["retry-after"]) >= 1
        assert limited.value.response.headers["x-ratelimit-limit-requests"] == "1"
        assert env.gateway.limiter.in_flight(env.gateway.keys.get("dave")) == 0

    _run(tmp_path, canned, test)


def test_a_quota_refusal_withdraws_the_admission(tmp_path: Path, canned: Canned) -> None:
    async def test(env: Env) -> None:
        client = env.client(env.key("erin", quota_tokens=500, max_concurrent=1))
        with pytest.raises(openai.RateLimitError) as refused:
            await client.chat.completions.create(model="m", messages=HELLO, max_tokens=1000)
        assert refused.value.code == "insufficient_quota"
        key = env.gateway.keys.get("erin")
        assert env.gateway.limiter.in_flight(key) == 0 and key.quota_used_at(time.time()) == 0
        answer = await client.chat.completions.create(model="m", messages=HELLO, max_tokens=5)
        assert answer.usage is not None and answer.usage.completion_tokens == 2
        await env.gateway.settler.drain()  # a quota settles in the database, off the loop
        assert env.gateway.keys.get("erin").quota_used_at(time.time()) == 11  # 9 + 2 used

    _run(tmp_path, canned, test)


def test_a_replica_gone_since_its_check_is_marked_and_the_call_gets_503(
    tmp_path: Path, canned: Canned
) -> None:
    async def test(env: Env) -> None:
        (gone,) = env.gateway.router.backends["dead"]
        gone.record_success(env.gateway.config.health)  # it passed its last check, then died
        with pytest.raises(openai.InternalServerError) as refused:
            await env.client(env.key("frank")).chat.completions.create(model="dead", messages=HELLO)
        assert refused.value.status_code == 503
        assert refused.value.code == "service_unavailable"
        assert gone.failures == 1 and gone.in_flight == 0
        (row,) = await env.rows("frank")
        assert (row["status"], row["backend"], row["prompt_tokens"]) == (503, None, 0)

    _run(tmp_path, canned, test)
