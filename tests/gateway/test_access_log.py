"""The gateway's access log: one line per request, never a query string (where a careless
client puts its key), and off with `--no-access-log` (or `access_log = false`).
Real `inhouse gateway` processes."""

from __future__ import annotations

import asyncio
import io
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from inhouse.gateway.access_log import AccessLog
from serving import free_port, gateway_toml, inhouse_command, stop, wait_healthy

SECRET = "ih-" + "s" * 43


def test_lines_hold_the_path_status_and_time_and_are_written_in_one_batch() -> None:
    stream = io.StringIO()
    log = AccessLog(stream, flush_after_s=0.05)
    scope = {
        "method": "GET",
        "path": "/v1/models",
        "query_string": f"api_key={SECRET}".encode(),
        "http_version": "1.1",
        "client": ("127.0.0.1", 5000),
    }

    async def two_requests() -> None:
        log.write(scope, 200, 0.0012)
        log.write({**scope, "client": None}, 401, 0.0003)
        assert stream.getvalue() == ""  # not yet: lines are batched
        await asyncio.sleep(0.2)

    asyncio.run(two_requests())
    assert stream.getvalue().splitlines() == [
        '127.0.0.1:5000 - "GET /v1/models HTTP/1.1" 200 1.2ms',
        '- - "GET /v1/models HTTP/1.1" 401 0.3ms',
    ]


def _gateway_log(tmp_path: Path, *flags: str) -> str:
    """Start a gateway, send two requests with a key in the query string, stop it; its output."""
    port = free_port()
    config = tmp_path / "inhouse.toml"
    config.write_text(
        gateway_toml(
            {"port": port, "database": f"sqlite:///{tmp_path / 'gw.db'}"},
            [{"name": "m", "backends": [{"url": "http://127.0.0.1:9"}]}],
        )
    )
    log = tmp_path / "gateway.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*inhouse_command(), "gateway", "--config", str(config), *flags],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/metrics", proc, log, 60)
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/v1/models?api_key={SECRET}").status_code == 401
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        chat = httpx.post(f"{url}/v1/chat/completions?api_key={SECRET}", json=body)
        assert chat.status_code == 401
        time.sleep(1.0)  # past one flush interval
    finally:
        stop(proc)
    return log.read_text()


@pytest.mark.slow
def test_gateway_logs_each_request_without_its_query_string(tmp_path: Path) -> None:
    text = _gateway_log(tmp_path)
    assert '"GET /v1/models HTTP/1.1" 401' in text
    assert '"POST /v1/chat/completions HTTP/1.1" 401' in text
    assert SECRET not in text and "api_key" not in text


@pytest.mark.slow
def test_no_access_log_flag_turns_it_off(tmp_path: Path) -> None:
    text = _gateway_log(tmp_path, "--no-access-log")
    assert "/v1/models" not in text and "/v1/chat/completions" not in text
    assert "Uvicorn running" in text  # the process did log, just not requests
