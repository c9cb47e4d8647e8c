"""A real `inhouse gateway` process on 127.0.0.1 in front of the canned upstream (see
`canned_upstream`), with a metrics token, a real SQLite file and its key store: what the
issue-24 end-to-end tests run against."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
from canned_upstream import SLOW_MODEL, Canned

from inhouse.gateway.audit.writer import recent_rows
from inhouse.gateway.config import GatewayConfig
from inhouse.gateway.db_open import open_database
from inhouse.gateway.keys import KeyStore, load_pepper
from serving import Process, audit_rows, free_port, gateway_toml, inhouse_command

TOKEN_ENV = "INHOUSE_TEST_METRICS_TOKEN"
MAX_CONTEXT = 2048


@dataclass
class Gateway:
    """One `inhouse gateway` process, its key store and what it holds."""

    url: str
    process: Process
    store: KeyStore
    db_url: str
    backend_key: str
    metrics_token: str

    def key(self, name: str, **limits: Any) -> str:
        return self.store.create(name, **limits)[1]

    def client(self, secret: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=secret, max_retries=0)

    def post(self, path: str, secret: str, body: dict[str, Any]) -> httpx.Response:
        auth = {"Authorization": f"Bearer {secret}"}
        return httpx.post(f"{self.url}{path}", json=body, headers=auth, timeout=30)

    def scrape(self, path: str) -> httpx.Response:
        auth = {"Authorization": f"Bearer {self.metrics_token}"}
        return httpx.get(f"{self.url}{path}", headers=auth, timeout=10)

    def access_lines(self, path: str) -> list[str]:
        """The access log's lines for `path`, once its batch is written."""
        time.sleep(1.0)  # past one flush interval (0.5 s)
        return [x for x in self.process.log.read_text().splitlines() if f" {path} HTTP" in x]


def gateway_config(
    port: int, db_url: str, upstream: str, backend_key: str, extra: dict[str, Any],
    adapters: tuple[str, ...] = (), vision: bool = False,
) -> str:  # fmt: skip
    def route(name: str, model: str, *more: str) -> dict[str, Any]:
        backend = {
            "name": f"canned-{name}", "url": upstream, "api_key": backend_key, "model": model,
            "kind": "vllm", "capabilities": ["chat", "completions", "embeddings", *more],
            "max_context": MAX_CONTEXT,
        }  # fmt: skip
        if adapters and name == "m":
            backend["adapters"] = list(adapters)
        return {"name": name, "backends": [backend]}

    routes = [route("m", "up-model"), route("slow", SLOW_MODEL)]
    return gateway_toml(
        {"port": port, "database": db_url, "drain_timeout_s": 1, "metrics_token_env": TOKEN_ENV,
         **extra},
        [*routes, route("eyes", "vision-model", "vision")] if vision else routes,
        health={"interval_s": 1},
        audit={"flush_interval_s": 0.2},
    )  # fmt: skip


def start_gateway(
    base: Path, canned: Canned, extra: dict[str, Any] | None = None, database: str | None = None,
    adapters: tuple[str, ...] = (), vision: bool = False,
) -> Gateway:  # fmt: skip
    """A gateway in `base` in front of `canned`, once its /health says 200; `extra` keys
    go into its [gateway] table; model `m`'s backend declares `adapters`; with `vision` a
    model `eyes` takes images (its backend declares the capability). Its database is a
    SQLite file in `base`, or `database` (a PostgreSQL URL; its pepper file is made in
    `base`)."""
    base.mkdir(parents=True, exist_ok=True)
    port, db_url = free_port(), database or f"sqlite:///{base / 'gateway.db'}"
    pepper_file = None if database is None else base / "pepper"  # made by `load_pepper`
    extra = {**(extra or {}), **({"pepper_file": str(pepper_file)} if pepper_file else {})}
    backend_key, token = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    config = base / "inhouse.toml"
    config.write_text(
        gateway_config(port, db_url, canned.url, backend_key, extra, adapters, vision)
    )
    args = [*inhouse_command(), "gateway", "--config", str(config)]
    process = Process(args, base / "gateway.log", {TOKEN_ENV: token})
    pepper = load_pepper(GatewayConfig(models=(), database=db_url, pepper_file=pepper_file))
    store = KeyStore(open_database(db_url), pepper)
    process.start()
    url = f"http://127.0.0.1:{port}"
    process.wait_healthy(f"{url}/health", 60)
    return Gateway(url, process, store, db_url, backend_key, token)


def key_rows(gateway: Gateway, name: str | None, expect: int) -> list[dict[str, Any]]:
    """The audit rows of key `name` (None: of requests no key was taken for), oldest first,
    once `expect` of them are written."""
    if name is not None:
        return audit_rows(gateway.db_url, name, expect)
    db = open_database(gateway.db_url)
    deadline = time.monotonic() + 10
    try:
        while True:
            rows = [r for r in recent_rows(db, 1000) if r["key_name"] is None][::-1]
            if len(rows) >= expect or time.monotonic() > deadline:
                return rows
            time.sleep(0.1)
    finally:
        db.dispose()
