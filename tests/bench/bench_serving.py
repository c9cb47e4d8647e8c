"""Start a real `inhouse serve` on loopback for the bench's end-to-end tests (never a mock)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import httpx

from inhouse.gateway.up import free_port, inhouse_command
from serving import stop, wait_healthy

API_KEY = "bench-key"
STARTUP_TIMEOUT_S = 600


@dataclass
class Served:
    """A running `inhouse serve` process and how to reach it."""

    url: str
    model: str
    process: subprocess.Popen
    log: Path

    def stop(self) -> None:
        stop(self.process)


def start_serve(log: Path, *flags: str) -> Served:
    """`inhouse serve --port P …` on the bundled model; returns once /health says 200."""
    port = free_port()
    command = [
        *inhouse_command(),
        "serve",
        "--port",
        str(port),
        "--api-key",
        API_KEY,
        "--embedding-model",
        "none",
        *flags,
    ]
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    served = Served(f"http://127.0.0.1:{port}", "", process, log)
    try:
        wait_healthy(f"{served.url}/health", process, log, STARTUP_TIMEOUT_S)
    except BaseException:
        served.stop()
        raise
    models = httpx.get(
        f"{served.url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10
    ).json()
    served.model = models["data"][0]["id"]
    return served
