"""Streams their clients drop (issue 43): each is charged the prompt's real tokens and the
tokens generated before the drop, in the audit row and the key's quota alike, where the
reservation's chars/4 estimate was charged before (8 prompt tokens for a 35-token prompt).
A dropped stream's completion is charged at least what its client read and, all together,
at most what the engine generated for them: on a loaded host the gateway relays a few more
chunks into the closed connection before it sees the close, and charges those too.

One real `inhouse serve` (the session's bundled one), one real `inhouse gateway`, raw HTTP
streams closed after their third event (the role chunk and two content chunks).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from inhouse.gateway.backends import sample_totals
from inhouse.gateway.config_file import load_config
from inhouse.gateway.db_open import open_database
from inhouse.gateway.keys import KeyStore, load_pepper
from serving import SERVE_KEY, Process, Served, audit_rows, free_port, gateway_toml, inhouse_command

pytest.importorskip("inhouse.server.app", reason="inhouse serve is not importable")

pytestmark = pytest.mark.slow

UPSTREAM_MODEL = "SmolLM2-135M-Instruct"
PROMPTS = [
    "Say hello.",
    "Write a long story about a dragon who learns to bake bread in a small village.",
    "List every colour you know, one per line, with a sentence about each of them.",
    "Explain how a bicycle works.",
    "What is the capital of France? Answer in a long paragraph.",
]
DROPS = 50
EVENTS_READ = 3  # the role chunk and two content chunks
CONTENT_READ = EVENTS_READ - 1
CONCURRENCY = 5


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, bundled_serve: Served) -> Iterator[tuple]:
    base = tmp_path_factory.mktemp("abandoned-streams")
    port, db_url = free_port(), f"sqlite:///{base / 'gateway.db'}"
    backend = {"url": bundled_serve.url, "api_key": SERVE_KEY, "model": UPSTREAM_MODEL}
    config = base / "inhouse.toml"
    config.write_text(
        gateway_toml(
            {"port": port, "database": db_url},
            [{"name": "smol", "backends": [backend]}],
            health={"interval_s": 1},
            audit={"flush_interval_s": 0.2},
        )
    )
    process = Process([*inhouse_command(), "gateway", "--config", str(config)], base / "gw.log")
    store = KeyStore(open_database(db_url), load_pepper(load_config(config)))
    url = f"http://127.0.0.1:{port}"
    try:
        process.start()
        process.wait_healthy(f"{url}/health", 60)
        yield url, store, db_url, bundled_serve.url
    finally:
        process.stop()


def _body(prompt: str, max_tokens: int, stream: bool) -> dict:
    return {
        "model": "smol", "messages": [{"role": "user", "content": prompt}], "temperature": 0,
        "max_tokens": max_tokens, "ignore_eos": True, "stream": stream,
    }  # fmt: skip


async def _drop(http: httpx.AsyncClient, url: str, secret: str, prompt: str) -> int:
    """Stream `prompt`, close the connection after `EVENTS_READ` events; the content
    chunks read."""
    auth = {"Authorization": f"Bearer {secret}"}
    body = _body(prompt, 200, stream=True)
    events = content = 0
    async with http.stream("POST", f"{url}/v1/chat/completions", json=body, headers=auth) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                events += 1
                content += '"content":"' in line and '"content":""' not in line
                if events == EVENTS_READ:
                    break
    return content


def _drop_all(url: str, secret: str, prompts: list[str]) -> list[int]:
    async def run() -> list[int]:
        gate = asyncio.Semaphore(CONCURRENCY)
        async with httpx.AsyncClient(timeout=120) as http:

            async def one(prompt: str) -> int:
                async with gate:
                    return await _drop(http, url, secret, prompt)

            return await asyncio.gather(*(one(p) for p in prompts))

    return asyncio.run(run())


def _generated(serve_url: str) -> float:
    """Tokens the engine generated so far (its own counter on `/metrics`)."""
    auth = {"Authorization": f"Bearer {SERVE_KEY}"}
    page = httpx.get(f"{serve_url}/metrics", headers=auth, timeout=10).text
    return sum(v for n, v in sample_totals(page).items() if n == "inhouse:generation_tokens_total")


def _finished(url: str, secret: str, prompt: str) -> tuple[int, int]:
    """Usage of the same request finished at the drop point (`CONTENT_READ` tokens)."""
    auth = {"Authorization": f"Bearer {secret}"}
    body = _body(prompt, CONTENT_READ, stream=False)
    usage = httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth, timeout=120)
    usage.raise_for_status()
    return usage.json()["usage"]["prompt_tokens"], usage.json()["usage"]["completion_tokens"]


@pytest.mark.parametrize("limits", [{}, {"quota_tokens": 10**6}], ids=["plain", "quota"])
def test_dropped_streams_are_charged_what_they_used(
    gateway: tuple[str, KeyStore, str, str], limits: dict
) -> None:
    """Each dropped stream: prompt exact, completion no less (by more than 2 tokens) than the
    same request finished at the drop point, and all of them no more than the engine
    generated for them; the key's quota holds exactly the audit's charges."""
    url, store, db_url, serve_url = gateway
    name = f"dropper-{len(limits)}"
    secret = store.create(name, **limits)[1]
    finished = {p: _finished(url, secret, p) for p in PROMPTS}
    drops = DROPS if not limits else DROPS // 5
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(drops)]
    before = _generated(serve_url)
    read = _drop_all(url, secret, prompts)
    assert read == [CONTENT_READ] * drops
    rows = audit_rows(db_url, name, len(PROMPTS) + drops)[len(PROMPTS) :]
    assert len(rows) == drops
    assert all(r["status"] == 499 and r["stream"] for r in rows), rows
    # rows are in settling order, not sending order: compare the prompts as multisets
    assert sorted(r["prompt_tokens"] for r in rows) == sorted(finished[p][0] for p in prompts)
    off = [r["completion_tokens"] - CONTENT_READ for r in rows]
    print(f"\n{name}: {drops} dropped streams, prompts charged exactly; completion charged "
          f"minus the {CONTENT_READ} tokens at the drop: {sorted(off)}")  # fmt: skip
    assert all(d >= -2 for d in off), off
    generated = _generated(serve_url) - before  # read after every drop was settled
    assert sum(r["completion_tokens"] for r in rows) <= generated, (off, generated)
    if "quota_tokens" in limits:
        charged = sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows)
        charged += sum(p + c for p, c in finished.values())
        deadline = time.monotonic() + 10
        while store.get(name).quota_used != charged and time.monotonic() < deadline:
            time.sleep(0.1)
        assert store.get(name).quota_used == charged
