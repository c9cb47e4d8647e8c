"""The vLLM stack the end-to-end tests share: `inhouse up --engine vllm --replicas 2` on the
bundled model (two replicas on one core each, the gateway in front), started once per session
(`tests/up/conftest.py`: torch.compile makes a start take minutes on 2 cores), and what the
tests read of it."""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai

from inhouse.gateway.backends import sample_totals
from inhouse.up.command import REPLICA_KEY_ENV
from serving import free_port, inhouse_command, log_tail, pid_alive, wait_healthy

MODEL = "SmolLM2-135M-Instruct"
START_TIMEOUT_S = 1500  # two cold vLLM starts on one core each, on a loaded CI machine
STOP_TIMEOUT_S = 60


def replicas(log: Path) -> dict[str, tuple[int, str]]:
    """Each replica's label → (pid, URL), as `inhouse up` printed them."""
    found = re.findall(r"^replica (\S+): pid (\d+) on (\S+)$", log.read_text(), re.MULTILINE)
    return {label: (int(pid), url) for label, pid, url in found}


def replica_key(pid: int) -> str:
    """The key `inhouse up` gave a vLLM replica (in its environment, never printed): what a
    user who starts vLLM themselves passes it as `--api-key` or `$VLLM_API_KEY`."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    (key,) = [v.split(b"=", 1)[1] for v in environ if v.startswith(b"VLLM_API_KEY=")]
    return key.decode()


def finished_requests(url: str) -> float:
    """Requests a replica finished, from its own /metrics (vLLM's names)."""
    page = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        value
        for name, value in sample_totals(page).items()
        if name.startswith("vllm:request_success")
    )


# The AVX2 emulation's caps on torch and oneDNN (docs/serve.md) are for inhouse's own
# paths. vLLM picks its build by the CPU's flags (`torch.cpu._is_avx512_supported`), which
# no variable hides, and its AVX-512 build's engine fails to start under oneDNN capped at
# AVX2; on a real AVX2 host it loads its AVX2 build.
FOREIGN_CPU_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")


def vllm_environ(**extra: str) -> dict[str, str]:
    """This process's environment for a process that starts vLLM, less the emulation caps."""
    kept = {k: v for k, v in os.environ.items() if k not in FOREIGN_CPU_CAPS}
    return {**kept, **extra}


@contextmanager
def running_up_vllm(home: Path, count: int = 2, extra: tuple[str, ...] = ()) -> Iterator[dict]:
    """`inhouse up --engine vllm --replicas COUNT` (and `extra` options) on the bundled model,
    once every replica answers; then SIGINT, as Ctrl-C sends, and every replica must be gone."""
    port = free_port()
    log = home / "up.log"
    argv = [*inhouse_command(), "up", "--engine", "vllm", "--replicas", str(count)]
    argv += ["--port", str(port), "--max-model-len", "2048", "--max-num-seqs", "8", *extra]
    replica_key = secrets.token_urlsafe(24)  # so a test can reach one replica directly
    env = vllm_environ(INHOUSE_HOME=str(home / "home"), **{REPLICA_KEY_ENV: replica_key})
    with open(log, "wb") as out:
        up = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    gateway = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    try:
        wait_healthy(f"{gateway}/health", up, log, START_TIMEOUT_S)  # after the HF folder
        deadline = time.monotonic() + START_TIMEOUT_S
        ready = [f"replica vllm:{i} is ready" for i in range(1, count + 1)]
        while time.monotonic() < deadline:
            text = log.read_text()
            if all(line in text for line in ready):
                break
            assert up.poll() is None and "no replica started" not in text, log_tail(log)
            time.sleep(1)
        text = log.read_text()
        assert all(line in text for line in ready), log_tail(log)
        print(f"{count} vLLM replicas ready after {time.monotonic() - started:.0f} s")
        admin = re.findall(r"^ih-\S+$", text, flags=re.MULTILINE)[0]
        yield {
            "up": up,
            "log": log,
            "gateway": gateway,
            "admin": admin,
            "replica_key": replica_key,
            "env": env,
            "database": f"sqlite:///{home / 'home' / 'gateway.db'}",
        }
    finally:
        pids = [pid for pid, _ in replicas(log).values()]
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            up.wait(timeout=STOP_TIMEOUT_S)
        assert len(pids) == count and not any(pid_alive(pid) for pid in pids), log_tail(log)


def client(up: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{up['gateway']}/v1", api_key=up["admin"], max_retries=0)


def make_key(up: dict, name: str, priority: str = "default") -> str:
    """A new key of class `priority` in the running gateway's database; its secret."""
    argv = [*inhouse_command(), "keys", "create", name, "--priority", priority]
    done = subprocess.run(argv, capture_output=True, text=True, env=up["env"], timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]
