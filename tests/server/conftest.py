"""One real ``inhouse serve`` (uvicorn, bundled model, small KV budget) for the server tests."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import openai
import pytest

from inhouse.gateway.up import free_port, inhouse_command
from serving import stop, wait_healthy

API_KEY = "test-key"
MAX_BODY_BYTES = 64 * 1024
MAX_MODEL_LEN = 1024
STARTUP_TIMEOUT_S = 240


@dataclass
class RunningServer:
    """The server under test and what was seen while it started."""

    base_url: str
    process: subprocess.Popen
    health_seen: list[int] = field(default_factory=list)

    def client(self, **kwargs) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.base_url}/v1", api_key=API_KEY, max_retries=0, **kwargs
        )

    def async_client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.base_url}/v1", api_key=API_KEY, max_retries=0)

    def http(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60
        )


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    command = [
        *inhouse_command(),
        "serve",
        "--port", str(port),
        "--api-key", API_KEY,
        "--kv-cache-memory", "128MiB",
        "--max-model-len", str(MAX_MODEL_LEN),
        "--max-num-seqs", "32",
        "--max-request-body", str(MAX_BODY_BYTES),
    ]  # fmt: skip
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=os.environ)
    running = RunningServer(f"http://127.0.0.1:{port}", process)
    try:
        wait_healthy(
            f"{running.base_url}/health", process, log, STARTUP_TIMEOUT_S, running.health_seen
        )
        yield running
    finally:
        stop(process)
