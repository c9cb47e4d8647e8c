"""The gateway end to end: real `inhouse serve` processes on loopback (two replicas and a
fallback), a real `inhouse gateway` process, a real SQLite file, the official client.

Tests share one stack per module and pass in any order: before each test every replica is
up again (`healthy` fixture), unless the test is marked `replicas_as_they_are` and sets the
replicas itself.
"""

from __future__ import annotations

import json
import math
import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from inhouse.gateway.config_file import load_config
from inhouse.gateway.db_open import open_database
from inhouse.gateway.keys import KeyStore, load_pepper
from serving import (
    Process,
    audit_rows,
    burst,
    free_port,
    gateway_toml,
    inhouse_command,
    serve_process,
    wait_healthy,
)

pytest.importorskip("inhouse.server.app", reason="inhouse serve (issue 4) is not importable yet")

pytestmark = pytest.mark.slow

HEALTH_INTERVAL_S = 1.0
QUEUE_WAIT_S = 3.0
UPSTREAM_MODEL = "SmolLM2-135M-Instruct"
HELLO = [{"role": "user", "content": "Say hello."}]


@dataclass
class Stack:
    base: Path
    gateway_url: str
    replicas: list[Process]
    replica_urls: list[str]
    fallback: Process
    gateway: Process
    store: KeyStore
    db_url: str
    secrets: list[str] = field(default_factory=list)

    def key(self, name: str, **limits: Any) -> str:
        _, secret = self.store.create(name, **limits)
        self.secrets.append(secret)
        return secret

    def client(self, secret: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.gateway_url}/v1", api_key=secret, max_retries=0)

    def audit(self, key_name: str, expect: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        return audit_rows(self.db_url, key_name, expect, timeout)

    def backend_states(self, model: str = "smol") -> list[str]:
        body = httpx.get(f"{self.gateway_url}/health").json()
        return [b["state"] for b in body["models"][model]["backends"]]

    def all_up(self) -> None:
        """Start the replicas that are not running; return once the gateway routes to all."""
        for replica, url in zip(self.replicas, self.replica_urls, strict=True):
            if replica.popen is None or replica.popen.poll() is not None:
                replica.start()
                assert replica.popen is not None
                wait_healthy(f"{url}/health", replica.popen, replica.log, 300)
        for model, count in (("smol", 2), ("smol-fb", 2), ("smol-r1", 1)):
            for index in range(count):
                _wait_state(self, model, index, "up", 30)


def _config(
    port: int, db_url: str, urls: list[str], fallback_url: str, keys: tuple[str, str]
) -> str:
    chat = ["chat", "completions"]
    replicas = [
        {"name": f"r{i + 1}", "url": u, "api_key": keys[0], "model": UPSTREAM_MODEL,
         "capabilities": chat, "max_context": 2048}
        for i, u in enumerate(urls)
    ]  # fmt: skip
    fallback = {
        "name": "fb", "url": fallback_url, "api_key": keys[1], "model": UPSTREAM_MODEL,
        "capabilities": chat,
    }  # fmt: skip
    return gateway_toml(
        {"port": port, "database": db_url},
        [
            {"name": "smol", "policy": "queue", "queue_max_depth": 16,
             "queue_max_wait_s": QUEUE_WAIT_S, "backends": replicas},
            {"name": "smol-r1", "backends": replicas[:1]},
            {"name": "smol-fb", "policy": "fallback", "queue_max_wait_s": 2,
             "fallback": fallback, "backends": replicas},
        ],
        health={"interval_s": HEALTH_INTERVAL_S, "timeout_s": 5},
        audit={"flush_interval_s": 0.2},
    )  # fmt: skip


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("gateway-e2e")
    replica_key, fallback_key = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    ports = [free_port() for _ in range(4)]
    replicas = [
        serve_process(ports[i], replica_key, base / f"serve-r{i + 1}.log") for i in range(2)
    ]
    fallback = serve_process(ports[2], fallback_key, base / "serve-fb.log")
    urls = [f"http://127.0.0.1:{p}" for p in ports[:3]]
    db_url = f"sqlite:///{base / 'gateway.db'}"
    config_path = base / "inhouse.toml"
    config_path.write_text(
        _config(ports[3], db_url, urls[:2], urls[2], (replica_key, fallback_key))
    )
    config = load_config(config_path)
    gateway = Process(
        [*inhouse_command(), "gateway", "--config", str(config_path)], base / "gateway.log"
    )
    store = KeyStore(open_database(db_url), load_pepper(config))
    procs = [*replicas, fallback, gateway]
    try:
        for proc in procs:
            proc.start()
        for proc, url in zip([*replicas, fallback], urls, strict=True):
            proc.wait_healthy(f"{url}/health", 300)
        gateway_url = f"http://127.0.0.1:{ports[3]}"
        gateway.wait_healthy(f"{gateway_url}/health", 60)
        yield Stack(base, gateway_url, replicas, urls[:2], fallback, gateway, store, db_url)
    finally:
        for proc in procs:
            proc.stop()


@pytest.fixture(autouse=True)
def healthy(stack: Stack, request: pytest.FixtureRequest) -> None:
    """Every replica up before each test, whatever ran before it."""
    if request.node.get_closest_marker("replicas_as_they_are") is None:
        stack.all_up()


def test_401_without_wrong_revoked_or_expired_key(stack: Stack) -> None:
    no_key = httpx.post(f"{stack.gateway_url}/v1/chat/completions", json={"model": "smol"})
    assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        stack.client("ih-" + secrets.token_urlsafe(32)).models.list()
    secret = stack.key("soon-revoked")
    client = stack.client(secret)
    reply = client.chat.completions.create(model="smol", messages=HELLO, max_tokens=1)
    assert reply.usage is not None and reply.usage.completion_tokens == 1
    stack.store.revoke("soon-revoked")
    with pytest.raises(openai.AuthenticationError, match="revoked"):
        client.chat.completions.create(model="smol", messages=HELLO, max_tokens=1)
    expiring = stack.key("expiring", expires_at=time.time() + 2)
    stack.client(expiring).models.list()
    time.sleep(2.1)
    with pytest.raises(openai.AuthenticationError, match="expired"):
        stack.client(expiring).models.list()


def _burst(stack: Stack, secret: str, n: int, **kwargs: Any) -> list[tuple[int, Any, Any]]:
    return burst([stack.gateway_url], secret, n, model="smol", messages=HELLO, **kwargs)


def _retry_after_then_pass(stack: Stack, secret: str, **kwargs: Any) -> None:
    """Exhaust the key, wait exactly what Retry-After says, and pass."""
    client = stack.client(secret)
    for _ in range(100):
        try:
            client.chat.completions.create(model="smol", messages=HELLO, **kwargs)
        except openai.RateLimitError as err:
            wait_ms = int(err.response.headers["retry-after-ms"])
            assert int(err.response.headers["retry-after"]) == math.ceil(wait_ms / 1000)
            time.sleep(wait_ms / 1000)
            client.chat.completions.create(model="smol", messages=HELLO, **kwargs)
            return
    pytest.fail("the key never hit its limit")


def test_rpm_under_50_concurrent_requests(stack: Stack) -> None:
    secret = stack.key("rpm", rpm=10)
    start = time.monotonic()
    results = _burst(stack, secret, 50, max_tokens=1)
    refill = math.floor((time.monotonic() - start) / 6.0)
    passed = [r for r in results if r[0] == 200]
    limited = [r for r in results if r[0] == 429]
    assert 10 <= len(passed) <= 10 + refill and len(passed) + len(limited) == 50
    for _, headers, _ in results:
        assert headers["x-ratelimit-limit-requests"] == "10"
    remaining = sorted(int(h["x-ratelimit-remaining-requests"]) for _, h, _ in passed)
    assert remaining[: 10 - refill] == list(range(10 - refill))
    for _, headers, body in limited:
        assert body["type"] == "requests" and body["code"] == "rate_limit_exceeded"
        assert 0 < float(headers["retry-after-ms"]) <= 6000
        assert headers["x-ratelimit-remaining-requests"] == "0"
    _retry_after_then_pass(stack, secret, max_tokens=1)


def test_tpm_under_50_concurrent_requests(stack: Stack) -> None:
    probe = stack.key("tpm-probe", tpm=100_000)  # reserves as the limited key does
    used = stack.client(probe).chat.completions.create(model="smol", messages=HELLO, max_tokens=4)
    reserved = stack.audit("tpm-probe", 1)[0]["reserved_tokens"]
    real = used.usage.total_tokens
    secret = stack.key("tpm", tpm=400)
    start = time.monotonic()
    results = _burst(stack, secret, 50, max_tokens=4)
    refill = (time.monotonic() - start) * 400 / 60
    passed = [r for r in results if r[0] == 200]
    limited = [r for r in results if r[0] == 429]
    assert passed and limited
    assert len(passed) <= math.floor((400 + refill) / min(reserved, real))
    assert {body["type"] for _, _, body in limited} == {"tokens"}
    for _, headers, _ in results:
        assert headers["x-ratelimit-limit-tokens"] == "400"
        assert headers["x-ratelimit-reset-tokens"].endswith("s")
    remaining = sorted((int(h["x-ratelimit-remaining-tokens"]) for _, h, _ in passed), reverse=True)
    assert 400 - reserved <= remaining[0] <= 400 - reserved + refill + 1
    assert all(0 <= r < 400 for r in remaining)


def test_tpm_retry_after_is_the_time_until_the_tokens_fit(stack: Stack) -> None:
    secret = stack.key("tpm-retry", tpm=600)
    client = stack.client(secret)
    start = time.monotonic()
    first = client.chat.completions.with_raw_response.create(
        model="smol", messages=HELLO, max_tokens=1
    )
    charged = first.parse().usage.total_tokens
    prompt = stack.audit("tpm-retry", 1)[0]["reserved_tokens"] - 1  # exact: from /tokenize
    big = 598 - prompt  # reserves 598 of 600: fits the limit, not what is left of it
    with pytest.raises(openai.RateLimitError) as err:
        client.chat.completions.create(model="smol", messages=HELLO, max_tokens=big)
    elapsed_ms = (time.monotonic() - start) * 1000
    assert err.value.body["type"] == "tokens"
    wait_ms = int(err.value.response.headers["retry-after-ms"])
    reserve = prompt + big
    expected_ms = (reserve - (600 - charged)) * 100  # 600 tokens/min: 100 ms per token
    assert expected_ms - elapsed_ms - 1 <= wait_ms <= expected_ms + 1  # tokens refill meanwhile
    time.sleep(wait_ms / 1000)
    reply = client.chat.completions.create(model="smol", messages=HELLO, max_tokens=big, stop=[" "])
    assert reply.usage is not None and 1 <= reply.usage.completion_tokens <= big


def test_concurrency_cap(stack: Stack) -> None:
    secret = stack.key("narrow", max_concurrent=2)
    results = _burst(stack, secret, 6, max_tokens=24, extra_body={"ignore_eos": True})
    statuses = sorted(r[0] for r in results)
    assert statuses == [200, 200, 429, 429, 429, 429]
    codes = {body["code"] for status, _, body in results if status == 429}
    assert codes == {"concurrency_limit_exceeded"}
    reply = stack.client(secret).chat.completions.create(model="smol", messages=HELLO, max_tokens=1)
    assert reply.usage is not None and reply.usage.completion_tokens == 1  # both slots are back


def test_quota_exhaustion(stack: Stack) -> None:
    secret = stack.key("quota", quota_tokens=300, quota_period_s=86400)
    client = stack.client(secret)
    charged = 0
    for _ in range(40):
        try:
            charged += client.chat.completions.create(
                model="smol", messages=HELLO, max_tokens=4
            ).usage.total_tokens
        except openai.RateLimitError as err:
            assert err.body["type"] == "insufficient_quota"
            assert err.body["code"] == "insufficient_quota"
            break
    else:
        pytest.fail("quota never ran out")
    rows = stack.audit("quota", 1)
    worst_overshoot = max(
        0,
        max(
            r["prompt_tokens"] + r["completion_tokens"] - r["reserved_tokens"]
            for r in rows
            if r["status"] == 200
        ),
    )
    # A sequential client can overshoot by its last request and by the one before,
    # whose settlement may still hold only its reservation when the last is admitted.
    assert 0 < charged <= 300 + 2 * worst_overshoot
    deadline = time.monotonic() + 5
    while stack.store.get("quota").quota_used != charged and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stack.store.get("quota").quota_used == charged


def test_stream_usage_is_forced_upstream_stripped_and_reconciled(stack: Stack) -> None:
    secret = stack.key("streamer", tpm=100_000)
    client = stack.client(secret)
    plain = list(
        client.chat.completions.create(model="smol", messages=HELLO, max_tokens=8, stream=True)
    )
    assert all(chunk.usage is None for chunk in plain)
    with_usage = list(
        client.chat.completions.create(
            model="smol",
            messages=HELLO,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usage = with_usage[-1].usage
    assert usage is not None and not with_usage[-1].choices
    first, second = stack.audit("streamer", 2)
    for row in (first, second):
        assert row["stream"] and row["status"] == 200
        assert row["prompt_tokens"] == usage.prompt_tokens
        assert row["reserved_tokens"] == row["prompt_tokens"] + 8  # exact prompt + the cap
    assert second["completion_tokens"] == usage.completion_tokens
    sent = sum(1 for c in plain if c.choices and c.choices[0].delta.content)
    assert sent <= first["completion_tokens"] <= 8
    headers = client.chat.completions.with_raw_response.create(
        model="smol", messages=HELLO, max_tokens=1
    ).headers
    charged_before = first["prompt_tokens"] + first["completion_tokens"]
    charged_before += second["prompt_tokens"] + second["completion_tokens"]
    remaining = int(headers["x-ratelimit-remaining-tokens"])
    reserve = stack.audit("streamer", 3)[-1]["reserved_tokens"]
    assert 100_000 - charged_before - reserve <= remaining <= 100_000 - reserve


def test_first_chunk_arrives_before_the_backend_finishes(stack: Stack) -> None:
    secret = stack.key("sse")
    start = time.perf_counter()
    counting = [{"role": "user", "content": "Count from 1 to 60, separated by spaces."}]
    stream = stack.client(secret).chat.completions.create(  # long enough to outlast a cold start
        model="smol",
        messages=counting,
        max_tokens=160,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    arrivals = [
        time.perf_counter() - start for c in stream if c.choices and c.choices[0].delta.content
    ]
    total = time.perf_counter() - start
    assert len(arrivals) >= 40
    assert arrivals[0] < total / 2, f"first chunk at {arrivals[0]:.3f}s of {total:.3f}s"


def test_client_disconnect_closes_the_upstream_stream(stack: Stack) -> None:
    secret = stack.key("quitter")
    with httpx.stream(
        "POST",
        f"{stack.gateway_url}/v1/chat/completions",
        headers={"Authorization": f"Bearer {secret}"},
        json={"model": "smol", "messages": HELLO, "max_tokens": 1000, "stream": True,
              "temperature": 0, "ignore_eos": True},
        timeout=30,
    ) as response:  # fmt: skip
        assert response.headers["x-accel-buffering"] == "no"
        seen = 0
        for line in response.iter_lines():
            if line.startswith("data: {"):
                seen += bool(json.loads(line[6:])["choices"][0]["delta"].get("content"))
            if seen == 3:
                break
    row = stack.audit("quitter", 1)[0]
    assert row["status"] == 499 and 3 <= row["completion_tokens"] < 500
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        running = sum(_gauge(url, "num_requests_running") for url in stack.replica_urls)
        if running == 0:
            break
        time.sleep(0.2)
    assert running == 0


def _gauge(url: str, suffix: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    values = [
        line.split()[-1] for line in text.splitlines() if line.startswith(f"inhouse:{suffix}")
    ]
    return sum(float(v) for v in values)


def test_image_to_a_text_only_model_is_refused_at_the_gateway(stack: Stack) -> None:
    secret = stack.key("painter")
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    with pytest.raises(openai.BadRequestError) as err:
        stack.client(secret).chat.completions.create(
            model="smol", messages=[{"role": "user", "content": [image]}], max_tokens=1
        )
    assert err.value.body["code"] == "unsupported_capability"
    assert "vision" in err.value.body["message"]
    row = stack.audit("painter", 1)[0]
    assert row["status"] == 400 and row["backend"] is None and row["latency_ms"] < 100


def test_an_oversized_body_is_refused_unread_and_the_gateway_keeps_serving(stack: Stack) -> None:
    secret = stack.key("bulky")
    words = "word " * (30 * 10**6 // 5)  # 30 MB of prompt, over the 20 MiB default
    body = json.dumps({"model": "smol", "messages": [{"role": "user", "content": words}]})
    url, auth = f"{stack.gateway_url}/v1/chat/completions", {"authorization": f"Bearer {secret}"}
    declared = httpx.post(url, content=body, headers=auth, timeout=30)

    def chunks() -> Iterator[bytes]:  # no content-length: counted while it arrives
        for start in range(0, len(body), 2**20):
            yield body[start : start + 2**20].encode()

    streamed = httpx.post(url, content=chunks(), headers=auth, timeout=30)
    for response in (declared, streamed):
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "request_too_large"
    reply = stack.client(secret).chat.completions.create(model="smol", messages=HELLO, max_tokens=1)
    assert reply.usage is not None and reply.usage.completion_tokens == 1


def test_audit_rows_equal_the_requests_made(stack: Stack) -> None:
    secret = stack.key("audited", log_content=True)
    client = stack.client(secret)
    usages = []
    for i in range(3):
        reply = client.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": f"Mail me at bob{i}@example.com"}],
            max_tokens=3,
        )  # fmt: skip
        usages.append((reply.usage.prompt_tokens, reply.usage.completion_tokens))
    for _ in range(2):
        chunks = list(
            client.chat.completions.create(
                model="smol", messages=HELLO, max_tokens=3, stream=True,
                stream_options={"include_usage": True},
            )
        )  # fmt: skip
        usages.append((chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens))
    rows = stack.audit("audited", 5)
    assert len(rows) == 5
    assert [(r["prompt_tokens"], r["completion_tokens"]) for r in rows] == usages
    assert [r["stream"] for r in rows] == [False] * 3 + [True] * 2
    assert all(r["model"] == "smol" and r["backend"] in ("r1", "r2") for r in rows)
    assert all(r["latency_ms"] > 0 for r in rows) and all(r["ttft_ms"] for r in rows[3:])
    assert "example.com" not in rows[0]["prompt_text"] and "[redacted]" in rows[0]["prompt_text"]
    assert rows[0]["completion_text"] is not None


def _wait_state(stack: Stack, model: str, index: int, state: str, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if stack.backend_states(model)[index] == state:
            return time.monotonic() - start
        time.sleep(0.1)
    raise AssertionError(f"backend {index} of {model} not {state} after {timeout}s")


def test_killing_a_replica_moves_traffic_to_the_other(stack: Stack) -> None:
    secret = stack.key("survivor")
    client = stack.client(secret)
    stack.replicas[0].kill()
    killed = time.monotonic()
    for _ in range(6):  # each lands on r2, at once or after r1 refused the connection
        reply = client.chat.completions.create(model="smol", messages=HELLO, max_tokens=1)
        assert reply.usage is not None and reply.usage.completion_tokens == 1
    down_after = _wait_state(stack, "smol", 0, "down", 3 * HEALTH_INTERVAL_S + 5)
    assert time.monotonic() - killed <= 3 * HEALTH_INTERVAL_S + 5, down_after
    after = len(stack.audit("survivor", 6))
    for _ in range(4):
        client.chat.completions.create(model="smol", messages=HELLO, max_tokens=1)
    rows = stack.audit("survivor", after + 4)
    assert all(r["status"] == 200 for r in rows)
    assert [r["backend"] for r in rows[after:]] == ["r2"] * 4


@pytest.mark.replicas_as_they_are
def test_all_replicas_down(stack: Stack) -> None:
    for index, replica in enumerate(stack.replicas):
        replica.kill()
        _wait_state(stack, "smol", index, "down", 3 * HEALTH_INTERVAL_S + 5)
    secret = stack.key("outage")
    client = stack.client(secret)
    reply = client.chat.completions.create(model="smol-fb", messages=HELLO, max_tokens=2)
    assert reply.usage.completion_tokens >= 1
    row = stack.audit("outage", 1)[-1]
    assert row["fallback_used"] and row["backend"] == "fb"
    start = time.monotonic()
    with pytest.raises(openai.InternalServerError) as err:
        client.chat.completions.create(model="smol", messages=HELLO, max_tokens=1)
    waited = time.monotonic() - start
    assert err.value.status_code == 503 and QUEUE_WAIT_S - 0.2 <= waited < QUEUE_WAIT_S + 3
    assert int(err.value.response.headers["retry-after"]) >= 1
    local_only = stack.key("local-only", allow_fallback=False)
    with pytest.raises(openai.InternalServerError) as err:
        stack.client(local_only).chat.completions.create(
            model="smol-fb", messages=HELLO, max_tokens=1
        )
    assert err.value.status_code == 503 and "retry-after" in err.value.response.headers
    assert stack.audit("local-only", 1)[-1]["backend"] is None


@pytest.mark.replicas_as_they_are
def test_restarting_a_replica_brings_it_back(stack: Stack) -> None:
    replica = stack.replicas[0]
    replica.kill()
    _wait_state(stack, "smol", 0, "down", 3 * HEALTH_INTERVAL_S + 5)
    replica.start()
    _wait_state(stack, "smol", 0, "up", 300)
    _wait_state(stack, "smol-r1", 0, "up", 30)
    secret = stack.key("welcome-back")
    reply = stack.client(secret).chat.completions.create(  # r1 is smol-r1's only replica
        model="smol-r1", messages=HELLO, max_tokens=1
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 1
    assert stack.audit("welcome-back", 1)[-1]["backend"] == "r1"
    metrics = httpx.get(f"{stack.gateway_url}/metrics").text
    up = [
        line
        for line in metrics.splitlines()
        if line.startswith("inhouse:gateway_backend_state{") and line.endswith(" 1.0")
    ]
    assert any('backend="r1"' in s and 'model_name="smol"' in s and '="up"' in s for s in up)
    assert (
        "inhouse:gateway_fallbacks_total" in metrics
        and "inhouse:gateway_mean_prompt_tokens" in metrics
    )


def test_tenants_never_share_prefix_cache(stack: Stack) -> None:
    """Model smol-r1 has one replica, so every request lands on the same server."""
    prompt = [{"role": "user", "content": "Summarise the following notes. " + "alpha beta " * 60}]
    clients = [stack.client(stack.key(name)) for name in ("tenant-a", "tenant-b")]

    def cached(client: openai.OpenAI) -> int:
        usage = client.chat.completions.create(model="smol-r1", messages=prompt, max_tokens=1).usage
        details = usage.prompt_tokens_details
        return 0 if details is None else details.cached_tokens or 0

    assert cached(clients[0]) == 0
    assert cached(clients[0]) > 0  # the same tenant hits its own prefix cache
    assert cached(clients[1]) == 0  # another tenant with the same prompt does not


def test_no_secret_in_any_log_or_database_column(stack: Stack) -> None:
    reply = stack.client(stack.key("discreet")).completions.create(
        model="smol", prompt="Hi", max_tokens=1
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 1
    audit = subprocess.run(
        [*inhouse_command(), "audit", "--database", stack.db_url, "--limit", "500"],
        capture_output=True,
        check=True,
    )
    assert stack.secrets
    files = [p for p in stack.base.iterdir() if p.is_file() and p.suffix != ".toml"]
    blobs = [p.read_bytes() for p in files] + [audit.stdout, audit.stderr]
    for secret in stack.secrets:
        assert not any(secret.encode() in blob for blob in blobs)
        assert any(stack.store.hash(secret).encode() in blob for blob in blobs)
    gateway_log = (stack.base / "gateway.log").read_bytes()
    config = load_config(stack.base / "inhouse.toml")
    for route in config.models:
        for upstream in (*route.backends, route.fallback):
            if upstream is not None and upstream.api_key:
                assert upstream.api_key.encode() not in gateway_log
    assert b"Bearer" not in gateway_log
