"""Engine replicas as processes: start, follow the log, wait for ready, stop.

Readiness is read from each engine's own `/health`: a refused connection or a 503
while the process lives is a cold start (loading), not a failure; a process that
exits, an engine that says its load failed, or no answer within the engine's start
timeout is a failed start, reported with the last lines of its log. Replicas run in
their own session (a terminal's Ctrl-C reaches only `inhouse up`, which stops them in
order) and get SIGTERM from the kernel if `inhouse up` itself dies.

On a CPU host the replicas' compute fills the cores, and the gateway's request path (a few
per cent of one core) would wait behind it: a probe's TTFT beside a flood went from 0.3 s
to 2-7 s, most of it before the gateway even read the request. So a replica there runs at
a lower CPU priority (`CPU_HOST_NICE`), as a process and as a session: where the kernel
groups sessions (autogroup), a process's nice counts only inside its own session.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TextIO

import httpx

from inhouse.launch.base import Command, Endpoint, Engine, Health

TAIL_LINES = 40
STOP_TIMEOUT_S = 15.0
CPU_HOST_NICE = 10  # a CPU host's replicas yield their cores to the gateway (module doc)
AUTOGROUP_TRIES = 5  # the kernel takes one autogroup change per 0.1 s from an unprivileged user
_PR_SET_PDEATHSIG = 1
# Looked up once here: the child may call only what needs no loader lock after fork.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def _before_exec(nice: int) -> None:
    """In the child, before exec: ask Linux for SIGTERM when the parent dies, and take the
    replica's CPU priority (which the engine's own processes and threads inherit)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if nice:
        os.nice(nice)


def _nice_session(pid: int, nice: int) -> None:
    """Put the session led by `pid` `nice` steps below this process's session, where the
    kernel groups sessions (its autogroup file: "/autogroup-7 nice 0")."""
    try:
        with open("/proc/self/autogroup") as ours:
            base = int(ours.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return
    for _ in range(AUTOGROUP_TRIES):
        try:
            with open(f"/proc/{pid}/autogroup", "w") as autogroup:
                autogroup.write(str(min(base + nice, 19)))
            return
        except OSError as err:
            if err.errno != errno.EAGAIN:
                return  # no autogroup in this kernel, or the process is gone
            time.sleep(0.1)


@dataclass
class Replica:
    """One running engine process and what its log said last."""

    engine: Engine
    index: int
    endpoint: Endpoint
    command: Command
    popen: subprocess.Popen[str]
    started: float = field(default_factory=time.monotonic)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=TAIL_LINES))
    follower: threading.Thread | None = None

    @property
    def label(self) -> str:
        return f"{self.engine.name}:{self.index}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint.host}:{self.endpoint.port}"

    def log_tail(self, lines: int = 15) -> str:
        return "".join(list(self.tail)[-lines:])

    def probe(self, client: httpx.Client) -> Health:
        """Where the replica stands now: FAILED once its process has exited."""
        if self.popen.poll() is not None:
            return Health.FAILED
        try:
            answer = client.get(f"{self.url}/health", timeout=2.0)
        except httpx.HTTPError:
            return Health.LOADING  # not listening yet: still starting
        return self.engine.health(answer.status_code, answer.text)

    def failure(self) -> str:
        """Why it failed to start, with its log's last lines."""
        code = self.popen.poll()
        if code is not None:
            why = f"exited with status {code}"
        elif time.monotonic() - self.started > self.engine.start_timeout_s:
            why = f"was not ready after {self.engine.start_timeout_s:g} s"
        else:
            why = "reported that loading failed"
        return f"replica {self.label} {why}; its log ended with:\n{self.log_tail()}"


def start_replica(
    engine: Engine, command: Command, endpoint: Endpoint, index: int, out: TextIO,
    cpu_host: bool = False,
) -> Replica:  # fmt: skip
    """Start one replica (on a CPU host, `CPU_HOST_NICE` steps below this process's CPU
    priority); its output goes to `out`, each line prefixed with its label."""
    nice = CPU_HOST_NICE if cpu_host else 0
    popen = subprocess.Popen(
        command.argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        errors="replace",
        env={**os.environ, **command.env},
        start_new_session=True,
        preexec_fn=functools.partial(_before_exec, nice),
    )
    if nice:
        _nice_session(popen.pid, nice)
    replica = Replica(engine, index, endpoint, command, popen)
    replica.follower = threading.Thread(target=_follow, args=(replica, out), daemon=True)
    replica.follower.start()
    return replica


def _follow(replica: Replica, out: TextIO) -> None:
    assert replica.popen.stdout is not None
    for line in replica.popen.stdout:
        replica.tail.append(line)
        out.write(f"[{replica.label}] {line}")
        out.flush()


def wait_started(
    replicas: list[Replica], poll_s: float = 0.5, stop: threading.Event | None = None
) -> dict[str, Health]:
    """Poll until every replica is ready or failed (a start timeout counts as failed)."""
    states = {r.label: Health.LOADING for r in replicas}
    stop = stop or threading.Event()
    with httpx.Client() as client:
        while any(s is Health.LOADING for s in states.values()):
            for replica in replicas:
                if states[replica.label] is not Health.LOADING:
                    continue
                state = replica.probe(client)
                late = time.monotonic() - replica.started > replica.engine.start_timeout_s
                states[replica.label] = Health.FAILED if state is Health.LOADING and late else state
            if stop.wait(poll_s):
                break
    return states


def stop_replicas(replicas: list[Replica]) -> None:
    """SIGTERM every replica's process group, then SIGKILL what is left after a grace time."""
    for replica in replicas:
        _signal(replica, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for replica in replicas:
        try:
            replica.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(replica, signal.SIGKILL)
            replica.popen.wait(timeout=STOP_TIMEOUT_S)
    for replica in replicas:
        if replica.follower is not None:
            replica.follower.join(timeout=2.0)


def _signal(replica: Replica, sig: signal.Signals) -> None:
    if replica.popen.poll() is not None:
        return
    try:
        os.killpg(replica.popen.pid, sig)
    except ProcessLookupError:
        return
