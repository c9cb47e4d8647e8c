"""LoRA adapters end to end: a real `inhouse serve --lora-modules` of the bundled model with a
random adapter built here (`lora_adapters`), a real `inhouse gateway` before it declaring the
adapter, a real SQLite file and the official client. The adapter answers under its own name
and differently from the base; a key limited to it gets 403 for another; usage by adapter
equals the client's counts; an admin loads a second adapter through the gateway, uses it and
unloads it while requests for the first run on, none of which fails."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from typer.testing import CliRunner

from inhouse.cli import app
from inhouse.gateway.config_file import load_config
from inhouse.gateway.db_open import open_database
from inhouse.gateway.keys import KeyStore, load_pepper
from lora_adapters import bundled_adapter
from serving import (
    Process,
    adapter_gateway_toml,
    audit_rows,
    free_port,
    gateway_process,
    start_serve,
)

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "Name three colours."}]
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 12}


@dataclass
class Stack:
    url: str
    store: KeyStore
    db_url: str
    gateway: Process

    def client(self, secret: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=secret, max_retries=0)

    def admin(self, path: str, secret: str, body: dict[str, Any]) -> httpx.Response:
        auth = {"Authorization": f"Bearer {secret}"}
        return httpx.post(f"{self.url}{path}", json=body, headers=auth, timeout=120)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("adapters")
    return {
        name: bundled_adapter(base / name, seed)
        for seed, name in enumerate(("support", "code", "legal"))
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, adapters: dict[str, Path]) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("adapter-stack")
    modules = [f"{name}={adapters[name]}" for name in ("support", "code")]
    served = start_serve(base / "serve.log", lora_modules=modules, max_loras="3")
    try:
        port, db_url = free_port(), f"sqlite:///{base / 'gateway.db'}"
        text = adapter_gateway_toml(port, db_url, served, ["support", "code"])
        gateway = gateway_process(base / "inhouse.toml", text)
        gateway.start()
        try:
            url = f"http://127.0.0.1:{port}"
            gateway.wait_healthy(f"{url}/health", 60)
            config = load_config(base / "inhouse.toml")
            store = KeyStore(open_database(db_url), load_pepper(config))
            yield Stack(url, store, db_url, gateway)
        finally:
            gateway.stop()
    finally:
        served.stop()


def test_the_adapter_answers_under_its_name_and_a_key_limited_to_it_is_refused_another(
    stack: Stack,
) -> None:
    client = stack.client(stack.store.create("support-desk", adapters=frozenset({"support"}))[1])
    listed = {m.id: getattr(m, "parent", None) for m in client.models.list()}
    assert listed == {"smol": None, "support": "smol"}  # the key's own, not "code"
    tuned = client.chat.completions.create(model="support", messages=ASK, **GREEDY)
    plain = client.chat.completions.create(model="smol", messages=ASK, **GREEDY)
    assert tuned.choices[0].message.content != plain.choices[0].message.content
    with pytest.raises(openai.PermissionDeniedError) as refused:
        client.chat.completions.create(model="code", messages=ASK, **GREEDY)
    assert refused.value.code == "adapter_not_allowed"


def by_adapter(db_url: str) -> dict[str, list[int]]:
    """`inhouse usage --by adapter`: requests, prompt and completion tokens per adapter."""
    result = CliRunner().invoke(app, ["usage", "--by", "adapter", "--json", "--database", db_url])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["rows"]
    return {r["group"]: [r["requests"], r["prompt_tokens"], r["completion_tokens"]] for r in rows}


def test_usage_by_adapter_equals_the_clients_counts(stack: Stack) -> None:
    time.sleep(1.0)  # the earlier tests' rows are written (flushed every 0.2 s)
    before = by_adapter(stack.db_url)
    client = stack.client(stack.store.create("counted")[1])
    counts = {"support": [0, 0, 0], "-": [0, 0, 0]}
    for model in ("support", "smol", "support"):
        usage = client.chat.completions.create(model=model, messages=ASK, **GREEDY).usage
        assert usage is not None
        into = counts["support" if model == "support" else "-"]
        for i, value in enumerate((1, usage.prompt_tokens, usage.completion_tokens)):
            into[i] += value
    rows = audit_rows(stack.db_url, "counted", 3)
    assert [(r["model"], r["adapter"]) for r in rows] == [
        ("smol", "support"), ("smol", None), ("smol", "support")
    ]  # fmt: skip
    after = by_adapter(stack.db_url)
    added = {
        group: [now - then for now, then in zip(sums, before.get(group, [0, 0, 0]), strict=True)]
        for group, sums in after.items()
    }
    assert {g: sums for g, sums in added.items() if any(sums)} == counts


def test_an_adapter_loaded_used_and_unloaded_under_traffic_fails_no_other_request(
    stack: Stack, adapters: dict[str, Path]
) -> None:
    admin = stack.store.create("ops", admin=True)[1]
    client = stack.client(stack.store.create("busy")[1])
    failures: list[BaseException] = []
    answered = 0
    stop = threading.Event()

    def traffic() -> None:
        nonlocal answered
        while not stop.is_set():
            try:
                client.chat.completions.create(model="support", messages=ASK, max_tokens=4)
                answered += 1
            except openai.APIError as err:
                failures.append(err)

    workers = [threading.Thread(target=traffic) for _ in range(2)]
    for worker in workers:
        worker.start()
    try:
        load = {"lora_name": "legal", "lora_path": str(adapters["legal"])}
        plain = stack.store.create("plain")[1]
        assert stack.admin("/v1/load_lora_adapter", plain, load).status_code == 403
        loaded = stack.admin("/v1/load_lora_adapter", admin, load)
        assert loaded.status_code == 200, loaded.text
        legal = client.chat.completions.create(model="legal", messages=ASK, **GREEDY)
        assert legal.usage is not None and legal.usage.completion_tokens > 0
        unloaded = stack.admin("/v1/unload_lora_adapter", admin, {"lora_name": "legal"})
        assert unloaded.status_code == 200, unloaded.text
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="legal", messages=ASK, **GREEDY)
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=120)
    assert failures == [] and answered > 0
