"""What the gateway shows and to whom, and how it stops (issue 24): key names and backend
addresses behind the metrics token (and Prometheus scraping with it), X-Forwarded-For
only from trusted proxies, a stream running at SIGTERM ended with an error event and logged
as audited. A real gateway before the canned upstream (`gateway_under_test`); the tests
that stop a gateway or need another config start their own.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from canned_upstream import Canned
from gateway_under_test import Gateway, key_rows, start_gateway

from inhouse.observe.scrape import prometheus_yaml
from serving import Process, debian_binary, free_port

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, canned: Canned) -> Iterator[Gateway]:
    running = start_gateway(tmp_path_factory.mktemp("gateway"), canned)
    try:
        yield running
    finally:
        running.process.stop()


# -- item 13: key names and backend addresses need the metrics token --------------------


def test_metrics_and_backend_addresses_need_the_metrics_token(gateway: Gateway) -> None:
    gateway.client(gateway.key("visible-name")).chat.completions.create(model="m", messages=HELLO)
    for path in ("/metrics", "/metrics/targets"):
        refused = httpx.get(f"{gateway.url}{path}")
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        assert "visible-name" not in refused.text and "127.0.0.1" not in refused.text
        wrong = httpx.get(f"{gateway.url}{path}", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
    assert 'key_name="visible-name"' in gateway.scrape("/metrics").text
    assert gateway.scrape("/metrics/targets").json()[0]["targets"]
    public = httpx.get(f"{gateway.url}/health")
    assert public.status_code == 200
    assert public.json() == {"status": "ok", "models": {"m": {"status": "up"},
                                                        "slow": {"status": "up"}}}  # fmt: skip
    detailed = gateway.scrape("/health").json()
    assert detailed["models"]["m"]["backends"][0]["url"].startswith("http://127.0.0.1:")


def test_prometheus_scrapes_with_the_token_file(gateway: Gateway, tmp_path: Path) -> None:
    """`inhouse observe prometheus --metrics-token-file`: a real Prometheus scrapes the gateway
    and discovers its backends with the token."""
    binary = debian_binary("prometheus", "prometheus")
    token_file = tmp_path / "metrics.token"
    token_file.write_text(gateway.metrics_token + "\n")
    (tmp_path / "rules.yml").write_text("groups: []\n")
    host_port = gateway.url.removeprefix("http://")
    config = prometheus_yaml(host_port, str(tmp_path / "rules.yml"), "1s", str(token_file))
    (tmp_path / "prometheus.yml").write_text(config)
    port = free_port()
    prometheus = Process(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        tmp_path / "prometheus.log",
    )  # fmt: skip
    prometheus.start()
    try:
        prometheus.wait_healthy(f"http://127.0.0.1:{port}/-/ready", 60)  # 503 until ready
        deadline, health = time.monotonic() + 60, {}
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                answer = httpx.get(f"http://127.0.0.1:{port}/api/v1/targets", timeout=5).json()
                health = {t["labels"]["job"]: t["health"] for t in answer["data"]["activeTargets"]}
                if health.get("inhouse-gateway") == "up" and "inhouse-backends" in health:
                    break
            time.sleep(0.5)
        assert health.get("inhouse-gateway") == "up", health
        assert "inhouse-backends" in health, "no backend discovered through /metrics/targets"
    finally:
        prometheus.stop()


# -- item 14: X-Forwarded-For only from trusted proxies ---------------------------------


def test_x_forwarded_for_from_an_untrusted_client_is_not_the_client(gateway: Gateway) -> None:
    forged = {"X-Forwarded-For": "203.0.113.7"}
    assert httpx.get(f"{gateway.url}/v1/models", headers=forged).status_code == 401
    (line,) = gateway.access_lines("/v1/models")[-1:]
    assert line.startswith("127.0.0.1:") and "203.0.113.7" not in line


def test_x_forwarded_for_from_a_trusted_proxy_names_the_client(
    tmp_path: Path, canned: Canned
) -> None:
    trusting = start_gateway(tmp_path, canned, {"trusted_proxies": ["127.0.0.1"]})
    try:
        forged = {"X-Forwarded-For": "203.0.113.7"}
        assert httpx.get(f"{trusting.url}/v1/models", headers=forged).status_code == 401
        (line,) = trusting.access_lines("/v1/models")
        assert line.startswith("203.0.113.7:")
    finally:
        trusting.process.stop()


# -- item 9: shutdown ends a stream with an error event, logged as audited --------------


def test_sigterm_ends_a_running_stream_with_an_error_event(tmp_path: Path, canned: Canned) -> None:
    stopping = start_gateway(tmp_path, canned)
    try:
        client = stopping.client(stopping.key("cut-stream"))
        stream = client.chat.completions.create(model="slow", messages=HELLO, stream=True)
        chunks = iter(stream)
        next(chunks)
        assert stopping.process.popen is not None
        stopping.process.popen.send_signal(signal.SIGTERM)
        with pytest.raises(openai.APIError) as ended:  # not httpx.RemoteProtocolError
            for _ in chunks:
                pass
        assert "shutting down" in ended.value.message
        stopping.process.popen.wait(timeout=30)  # uvicorn exits by the signal it got
        (row,) = key_rows(stopping, "cut-stream", 1)
        (line,) = [x for x in stopping.process.log.read_text().splitlines()
                   if "/v1/chat/completions HTTP" in x]  # fmt: skip
        assert row["status"] == 503 and row["error_type"] == "service_unavailable"
        assert '" 503 ' in line  # the access log says what the audit row says
    finally:
        stopping.process.stop()
