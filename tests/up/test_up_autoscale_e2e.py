"""`inhouse up --replicas 1:2` end to end (`up.autoscale`), short windows, the bundled model,
the official openai client: six clients at once on a replica of two seats start a second
replica, which serves; then two slow streams (each keeps to its replica by its prefix) are
load low enough for one replica: the newest is drained while its stream runs, the stream
ends whole, and one replica is left. No request fails over the whole run. Both ways a
second replica comes: from the warm pool (a CPU host's default: loaded before the load
came, routed at once, and loaded again after the drain) and cold (`--warm-replicas 0`).
While two replicas are routed they split the host's cores; alone again, one has them all."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

from inhouse.gateway.backends import sample_totals
from serving import audit_rows, log_tail, up_stack

pytestmark = pytest.mark.timeout(300)

MODEL = "SmolLM2-135M-Instruct"
CORES = os.sched_getaffinity(0)
SHORT_WINDOWS = ("--scale-up-after", "2s", "--scale-down-after", "3s", "--scale-cooldown", "2s")


class Clients:
    """`count` threads each sending requests back to back until stopped; counts outcomes."""

    def __init__(self, count: int, send: Callable[[int], None]) -> None:
        self.ok, self.failed = 0, []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._loop, args=(i, send)) for i in range(count)]
        for thread in self._threads:
            thread.start()

    def _loop(self, index: int, send: Callable[[int], None]) -> None:
        while not self._stop.is_set():
            try:
                send(index)
            except Exception as err:
                with self._lock:
                    self.failed.append(repr(err))
            else:
                with self._lock:
                    self.ok += 1

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)


def wait_for(log: Path, pattern: str, timeout: float = 120) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while (found := re.search(pattern, log.read_text(), re.MULTILINE)) is None:
        assert time.monotonic() < deadline, f"no {pattern!r} in:\n{log_tail(log)}"
        time.sleep(0.2)
    return found


def replica_pid(log: Path, slot: int) -> int:
    """The pid `inhouse up` printed for the replica in `slot`, its last start."""
    found = re.findall(rf"^replica inhouse:{slot}: pid (\d+) on ", log.read_text(), re.MULTILINE)
    assert found, log_tail(log)
    return int(found[-1])


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_second_replica_starts_under_load_and_is_drained_after(
    tmp_path: Path, warm: bool
) -> None:
    args = ("--replicas", "1:2", "--max-num-seqs", "2", *SHORT_WINDOWS,
            "--scale-down-below", "1.0", *(() if warm else ("--warm-replicas", "0")))  # fmt: skip
    with up_stack(tmp_path, "autoscale", *args) as stack:
        if warm:  # loaded once the first replica is ready, before any load
            wait_for(stack["log"], r"^replica inhouse:2 is warm on ")
        sdk = openai.OpenAI(base_url=f"{stack['gateway']}/v1", api_key=stack["admin"],
                            max_retries=0, timeout=120)  # fmt: skip

        def short(index: int) -> None:
            content = f"Client {index}, request {time.monotonic()}: name a colour."
            messages = [{"role": "user", "content": content}]
            sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)

        def slow(index: int) -> None:  # one prompt per client: its prefix keeps its replica
            content = f"Stream {index}: " + "count the committee members slowly. " * 8
            messages = [{"role": "user", "content": content}]
            stream = sdk.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=48, stream=True
            )
            assert sum(1 for _ in stream) > 1

        load = Clients(6, short)
        try:
            up = wait_for(stack["log"], r"autoscale: .* up 1 → 2 \((queue|waiting).*\)$")
            ready = wait_for(stack["log"], r"^replica inhouse:2 is ready on .*, (\S.*)\)$")
            assert ready.group(1) == ("from the warm pool" if warm else "cold")
            first, second = (replica_pid(stack["log"], n) for n in (1, 2))
            if len(CORES) >= 2:  # the two routed replicas split the cores between them
                split = os.sched_getaffinity(first), os.sched_getaffinity(second)
                assert not split[0] & split[1] and split[0] | split[1] == CORES, split
            deadline = time.monotonic() + 60
            while not any(r["backend"] == "inhouse:2" for r in audit_rows(
                    stack["database"], "admin", expect=0)):  # fmt: skip
                assert time.monotonic() < deadline, log_tail(stack["log"])
                time.sleep(0.5)
        finally:
            load.stop()
        trickle = Clients(2, slow)
        try:
            draining = wait_for(stack["log"], r"autoscale: draining inhouse:2: (\d+) request")
            wait_for(stack["log"], r"autoscale: drained inhouse:2: stopped after")
        finally:
            trickle.stop()
        if warm:  # the pool refilled: a fresh replica loaded in the drained one's slot
            wait_for(
                stack["log"], r"drained inhouse:2: stopped (?s:.*)^replica inhouse:2 is warm on "
            )
        assert os.sched_getaffinity(first) == CORES  # alone again: every core
        assert load.failed == [] and trickle.failed == [], (load.failed, trickle.failed)
        assert load.ok > 0 and trickle.ok > 0
        assert int(draining.group(1)) >= 1, log_tail(stack["log"])  # one ran on it, and ended
        assert "cut off" not in stack["log"].read_text()
        metrics = sample_totals(httpx.get(f"{stack['gateway']}/metrics", timeout=10).text)
        assert metrics["inhouse:replicas"] == 1 and metrics["inhouse:replicas_max"] == 2
        assert metrics["inhouse:scale_events_total"] == 2, up.group(0)  # one up, one down
        rows = audit_rows(stack["database"], "admin", expect=load.ok + trickle.ok)
        assert {r["status"] for r in rows} == {200}
