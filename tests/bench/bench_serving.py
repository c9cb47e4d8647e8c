"""Start a real `inhouse serve` on loopback for the bench's end-to-end tests (never a mock)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

API_KEY = "bench-key"
STARTUP_TIMEOUT_S = 600
INHOUSE = str(Path(sys.executable).with_name("inhouse"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Served:
    """A running `inhouse serve` process and how to reach it."""

    url: str
    model: str
    process: subprocess.Popen
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_serve(log: Path, *flags: str) -> Served:
    """`inhouse serve --port P …` on the bundled model; returns once /health says 200."""
    port = free_port()
    command = [
        INHOUSE,
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
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"inhouse serve exited:\n{log.read_text()}")
        try:
            if httpx.get(f"{served.url}/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    else:
        served.stop()
        raise RuntimeError(f"inhouse serve not ready in {STARTUP_TIMEOUT_S} s:\n{log.read_text()}")
    models = httpx.get(
        f"{served.url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10
    ).json()
    served.model = models["data"][0]["id"]
    return served
