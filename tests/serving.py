"""Shared by the end-to-end tests: wait until a real `inhouse` process answers, then stop it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest

POLL_S = 0.2


def log_tail(log: Path) -> str:
    """The last lines of a process log, enough to see why it failed."""
    return log.read_text()[-3000:]


def wait_healthy(
    url: str,
    process: subprocess.Popen,
    log: Path,
    timeout: float,
    seen: list[int] | None = None,
    fail_marker: str | None = None,
) -> None:
    """Poll GET `url` until it answers 200; fail with the log's tail if the process exits, the
    log shows `fail_marker`, or `timeout` seconds pass. Every status answered is added to `seen`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{process.args} exited with {process.returncode}:\n{log_tail(log)}")
        if fail_marker is not None and fail_marker in log.read_text():
            pytest.fail(f"{process.args} logged {fail_marker!r}:\n{log_tail(log)}")
        try:
            status = httpx.get(url, timeout=2).status_code
        except httpx.HTTPError:
            status = None
        if status is not None and seen is not None:
            seen.append(status)
        if status == 200:
            return
        time.sleep(POLL_S)
    pytest.fail(f"{url} not healthy after {timeout} s:\n{log_tail(log)}")


def stop(process: subprocess.Popen) -> None:
    """Terminate a process that is still running; kill it if it has not exited in 20 s."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)
