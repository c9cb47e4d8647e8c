"""Priority classes and degrade end to end: two real `inhouse serve` backends (the bundled
SmolLM2 as "big", and a tiny random-weight model the test writes as "small"), a real
`inhouse gateway` in front with one slot on "big", and the official `openai` client.

A batch key's long stream holds big's only slot. Then an interactive key is answered by
small at once (header and audit row say so); a no-degrade interactive key and a
default-class key wait their class's bound and get 429; and of two requests queued behind
the stream, the interactive one that came second is served first."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from inhouse.gateway.config_file import load_config
from inhouse.gateway.db_open import open_database
from inhouse.gateway.keys import KeyStore, load_pepper
from serving import (
    SERVE_KEY,
    Served,
    audit_rows,
    free_port,
    gateway_process,
    gateway_toml,
    start_serve,
)
from tiny_models import TINY_COMMON, save_tiny

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Say something."}]
INTERACTIVE_WAIT_S = 2.0  # the interactive and default classes' queue bound
DEGRADE_AFTER_S = 1.0
HOLD_TOKENS = 1000  # big's slot stays taken through the whole degrade scenario


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import LlamaConfig

    base = tmp_path_factory.mktemp("degrade")
    config = LlamaConfig(**TINY_COMMON, rope_theta=10000.0, tie_word_embeddings=False)
    folder = save_tiny(base / "small-random", config, seed=7)
    small = start_serve(
        base / "small.log", model=str(folder), served_model_name="small-random",
        max_model_len="512",
    )  # fmt: skip
    try:
        big = start_serve(base / "big.log")
    except BaseException:
        small.stop()
        raise
    yield big, small
    big.stop()
    small.stop()


class Stack:
    """A gateway in front of the two backends, and its key store."""

    def __init__(self, base: Path, big: Served, small: Served, policy: str) -> None:
        base.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.db_url = f"sqlite:///{base / 'gateway.db'}"
        path = base / "inhouse.toml"
        self.process = gateway_process(path, _config(self.port, self.db_url, big, small, policy))
        self.process.start()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process.wait_healthy(f"{self.url}/health", 60)
        config = load_config(path)
        self.store = KeyStore(open_database(config.database), load_pepper(config))

    def client(self, name: str, **settings: Any) -> openai.OpenAI:
        secret = self.store.create(name, **settings)[1]
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=secret, max_retries=0)

    def queue_depth(self) -> int:
        return httpx.get(f"{self.url}/health", timeout=5).json()["models"]["big"]["queue_depth"]

    def wait_queue(self, depth: int) -> None:
        deadline = time.monotonic() + 10
        while self.queue_depth() < depth:
            assert time.monotonic() < deadline, f"the queue never reached {depth}"
            time.sleep(0.02)


def _config(port: int, db_url: str, big: Served, small: Served, policy: str) -> str:
    degrade = {"degrade_to": "small", "degrade_after_s": DEGRADE_AFTER_S}
    short = INTERACTIVE_WAIT_S if policy == "degrade" else 120
    waits = {"interactive": short, "default": short, "batch": 120}
    return gateway_toml(
        {"port": port, "database": db_url, "drain_timeout_s": 1},
        [
            {"name": "big", "policy": policy, **(degrade if policy == "degrade" else {}),
             "queue_max_wait_s": waits,
             "backends": [{"name": "big-1", "url": big.url, "api_key": SERVE_KEY,
                           "model": big.model, "kind": "inhouse", "max_in_flight": 1}]},
            {"name": "small",
             "backends": [{"name": "small-1", "url": small.url, "api_key": SERVE_KEY,
                           "model": small.model, "kind": "inhouse"}]},
        ],
        health={"interval_s": 1},
        audit={"flush_interval_s": 0.2},
    )  # fmt: skip


@pytest.fixture
def stack(tmp_path: Path, backends: Any, request: pytest.FixtureRequest) -> Any:
    big, small = backends
    stack = Stack(tmp_path, big, small, request.param)
    yield stack
    stack.process.stop()


class Holder:
    """A batch key's long stream on big: it holds big's only slot until it ends."""

    def __init__(self, client: openai.OpenAI, max_tokens: int) -> None:
        self.stream = client.chat.completions.create(
            model="big", messages=MESSAGES, max_tokens=max_tokens, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        next(iter(self.stream))  # generating: the slot is taken
        self.started = time.monotonic()
        self.chunks = 1
        self.ended: float | None = None
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        for _ in self.stream:
            self.chunks += 1
        self.ended = time.monotonic()

    def join(self) -> float:
        self._thread.join(timeout=300)
        assert self.ended is not None, "the holding stream never ended"
        return self.ended


def _timed(call: Any) -> tuple[float, Any]:
    started = time.monotonic()
    try:
        result = call()
    except openai.APIStatusError as err:
        result = err
    return time.monotonic() - started, result


@pytest.mark.parametrize("stack", ["degrade"], indirect=True)
def test_interactive_requests_degrade_to_the_small_model_while_big_is_saturated(
    stack: Stack, backends: Any
) -> None:
    small = backends[1]
    batch = stack.client("etl", priority="batch")
    chat = stack.client("chat", priority="interactive")
    strict = stack.client("strict", priority="interactive", allow_degrade=False)
    plain = stack.client("plain")
    holder = Holder(batch, max_tokens=HOLD_TOKENS)
    # Nothing has ended on big yet: its expected wait is the holder's age, over the bound.
    time.sleep(max(0.0, holder.started + DEGRADE_AFTER_S + 0.3 - time.monotonic()))

    elapsed, raw = _timed(
        lambda: chat.chat.completions.with_raw_response.create(
            model="big", messages=MESSAGES, max_tokens=8, extra_body={"ignore_eos": True}
        )
    )
    assert not isinstance(raw, openai.APIStatusError), raw
    assert raw.headers["x-inhouse-degraded-from"] == "big"
    answer = raw.parse()
    assert answer.model == small.model  # the model that answered, as LiteLLM reports it
    # Random weights may pick end-of-text or tokens that decode to nothing: count tokens.
    assert answer.usage is not None and answer.usage.completion_tokens == 8
    assert elapsed < INTERACTIVE_WAIT_S, f"the degraded answer took {elapsed:.2f} s"

    def ask(client: openai.OpenAI) -> Any:
        return client.chat.completions.create(model="big", messages=MESSAGES, max_tokens=8)

    with ThreadPoolExecutor(2) as pool:
        refused = list(pool.map(lambda c: _timed(lambda: ask(c)), [strict, plain]))
    refused_at = time.monotonic()
    for waited, error in refused:
        assert isinstance(error, openai.RateLimitError), (error, holder.ended, holder.chunks)
        assert error.response.headers["retry-after"]
        assert error.body["code"] == "overloaded" and error.body["type"] == "rate_limit_exceeded"
        assert waited >= INTERACTIVE_WAIT_S - 0.1, f"refused after {waited:.2f} s, not its wait"
        assert "x-inhouse-degraded-from" not in error.response.headers
    assert holder.join() > refused_at, "big's slot freed up before the refusals: not saturated"

    (degraded,) = audit_rows(stack.db_url, "chat", 1)
    assert degraded["model"] == "small" and degraded["backend"] == "small-1"
    assert degraded["degraded_from"] == "big" and degraded["priority"] == "interactive"
    assert degraded["status"] == 200
    for name, priority in (("strict", "interactive"), ("plain", "default")):
        (row,) = audit_rows(stack.db_url, name, 1)
        assert (row["status"], row["model"], row["priority"]) == (429, "big", priority)
        assert row["degraded_from"] is None
    (held,) = audit_rows(stack.db_url, "etl", 1)
    assert (held["model"], held["priority"], held["degraded_from"]) == ("big", "batch", None)
    assert held["completion_tokens"] == HOLD_TOKENS


@pytest.mark.parametrize("stack", ["queue"], indirect=True)
def test_the_queue_serves_an_interactive_request_before_an_earlier_batch_one(
    stack: Stack,
) -> None:
    batch = stack.client("etl", priority="batch")
    chat = stack.client("chat", priority="interactive")
    holder = Holder(batch, max_tokens=60)
    ended: dict[str, float] = {}

    def ask(name: str, client: openai.OpenAI) -> None:
        client.chat.completions.create(model="big", messages=MESSAGES, max_tokens=4)
        ended[name] = time.monotonic()

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(ask, "batch", batch)
        stack.wait_queue(1)
        second = pool.submit(ask, "interactive", chat)
        stack.wait_queue(2)
        assert holder.ended is None, "the holder ended before both were queued"
        first.result(timeout=300)
        second.result(timeout=300)
    assert ended["interactive"] < ended["batch"]
    holder.join()
    rows = audit_rows(stack.db_url, "etl", 2)
    assert [r["priority"] for r in rows] == ["batch", "batch"]
    (row,) = audit_rows(stack.db_url, "chat", 1)
    assert row["priority"] == "interactive" and row["degraded_from"] is None
