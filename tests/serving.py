"""Shared by the end-to-end tests: start real `inhouse` processes (`start_serve` for one
`inhouse serve`, `Process` for anything else), wait until they answer, stop them, and fire
concurrent OpenAI calls at a gateway."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from inhouse.gateway.audit.writer import recent_rows
from inhouse.gateway.db_open import open_database
from inhouse.launch.inhouse import inhouse_command
from inhouse.launch.ports import free_port

__all__ = ["free_port", "inhouse_command"]  # and what is defined here

POLL_S = 0.2
SERVE_KEY = "serve-key"
STARTUP_TIMEOUT_S = 600
# `inhouse serve` small enough for CI; None leaves an option out (then serve's default holds).
SERVE_OPTIONS: dict[str, str | None] = {
    "max_model_len": "2048",
    "kv_cache_memory": "128MiB",
    "embedding_model": "none",
}


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


@dataclass
class Process:
    """A CLI process with its output in a log file."""

    args: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(
                self.args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
            )

    def wait_healthy(self, url: str, timeout: float) -> None:
        """Wait until `url` answers 200; fail if the process exits or logs a failure."""
        assert self.popen is not None, f"{self.args} was never started"
        wait_healthy(url, self.popen, self.log, timeout, fail_marker="failed")

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(timeout=30)

    def stop(self) -> None:
        if self.popen is not None:
            stop(self.popen)


def serve_process(
    port: int, key: str, log: Path, *, model: str | None = None, **options: str | list[str] | None
) -> Process:
    """`inhouse serve` of the bundled models (or of `model`, a folder or GGUF file) on a
    loopback port: `SERVE_OPTIONS`, with `options` (`max_num_seqs="4"` is
    `--max-num-seqs 4`; a list repeats the flag) added or replacing them."""
    args = [*inhouse_command(), "serve", *([model] if model else []), "--port", str(port)]
    for name, value in {**SERVE_OPTIONS, **options}.items():
        for one in value if isinstance(value, list) else [value]:
            if one is not None:
                args += [f"--{name.replace('_', '-')}", one]
    return Process(args, log, {"INHOUSE_API_KEY": key})


def gateway_toml(
    gateway: dict[str, Any], models: Iterable[dict[str, Any]], **tables: dict[str, Any]
) -> str:
    """The gateway's TOML: the `[gateway]` table, then each of `tables` (`health`, `audit`,
    `cost`, `releases`: a dict value is written inline), then each model as `[[models]]` with
    its `backends` list as `[[models.backends]]`."""
    parts = [_toml_table("[gateway]", gateway)]
    parts += [_toml_table(f"[{name}]", values) for name, values in tables.items()]
    for model in models:
        backends = model.get("backends", ())
        parts.append(_toml_table("[[models]]", {k: v for k, v in model.items() if k != "backends"}))
        parts += [_toml_table("[[models.backends]]", backend) for backend in backends]
    return "\n".join(parts)


def _toml_table(header: str, values: dict[str, Any]) -> str:
    lines = [header, *(f"{name} = {_toml_value(v)}" for name, v in values.items())]
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return json.dumps(str(value))  # a TOML basic string takes JSON's escapes
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return "[" + ", ".join(_toml_value(v) for v in value) + "]"


def gateway_process(config_path: Path, config_text: str) -> Process:
    """`inhouse gateway` on a config written to `config_path` (its log beside it)."""
    config_path.write_text(config_text)
    args = [*inhouse_command(), "gateway", "--config", str(config_path)]
    return Process(args, config_path.with_name("gateway.log"))


def gateway_key(config_path: Path, name: str) -> str:
    """Create a key called `name` in the database of the gateway config at `config_path`;
    returns its secret."""
    from inhouse.gateway.config_file import load_config
    from inhouse.gateway.keys import KeyStore, load_pepper

    config = load_config(config_path)
    _, secret = KeyStore(open_database(config.database), load_pepper(config)).create(name)
    return secret


@dataclass
class Served:
    """A running `inhouse serve`, its root URL and the model it serves."""

    process: Process
    url: str
    model: str = ""
    health_seen: list[int] = field(default_factory=list)

    def stop(self) -> None:
        self.process.stop()


def adapter_gateway_toml(port: int, db_url: str, served: Served, adapters: list[str]) -> str:
    """A gateway config of one model, `smol`, served by `served` (the backend `serve`),
    which declares these LoRA adapters; health read every second, audit rows flushed every
    0.2 s."""
    backend = {"name": "serve", "url": served.url, "api_key": SERVE_KEY, "model": served.model,
               "kind": "inhouse", "adapters": adapters}  # fmt: skip
    models = [{"name": "smol", "backends": [backend]}]
    return gateway_toml({"port": port, "database": db_url}, models, health={"interval_s": 1},
                        audit={"flush_interval_s": 0.2})  # fmt: skip


def start_serve(
    log: Path, key: str = SERVE_KEY, *, model: str | None = None, **options: str | list[str] | None
) -> Served:
    """Start `inhouse serve` (see `serve_process`) on a free port; return once /health says
    200, with every status /health answered while it loaded in `health_seen`."""
    port = free_port()
    process = serve_process(port, key, log, model=model, **options)
    served = Served(process, f"http://127.0.0.1:{port}")
    served.process.start()
    try:
        assert served.process.popen is not None
        wait_healthy(
            f"{served.url}/health", served.process.popen, log, STARTUP_TIMEOUT_S,
            served.health_seen,
        )  # fmt: skip
        auth = {"Authorization": f"Bearer {key}"}
        models = httpx.get(f"{served.url}/v1/models", headers=auth, timeout=10).json()
    except BaseException:
        served.stop()
        raise
    served.model = models["data"][0]["id"]
    return served


@contextmanager
def up_stack(tmp_path: Path, name: str, *args: str, ready: int = 1) -> Iterator[dict]:
    """`inhouse up ARGS --no-embeddings` in its own `$INHOUSE_HOME`, once the gateway is
    healthy and `ready` replicas said so: its URL, admin secret, replicas by label, env,
    database and log. Ctrl-C at the end."""
    port, log = free_port(), tmp_path / f"up-{name}.log"
    home = tmp_path / f"home-{name}"
    env = {**os.environ, "INHOUSE_HOME": str(home)}
    argv = [*inhouse_command(), "up", *args, "--port", str(port), "--no-embeddings"]
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", process, log, 300)
        deadline = time.monotonic() + 300
        while log.read_text().count(" is ready on ") < ready:
            assert process.poll() is None and time.monotonic() < deadline, log_tail(log)
            time.sleep(0.5)
        text = log.read_text()
        yield {
            "gateway": f"http://127.0.0.1:{port}",
            "admin": re.findall(r"^ih-\S+$", text, re.MULTILINE)[0],
            "replicas": dict(re.findall(r"^replica (\S+): pid \d+ on (\S+)$", text, re.MULTILINE)),
            "env": env,
            "database": f"sqlite:///{home / 'gateway.db'}",
            "log": log,
        }
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=60)


def audit_rows(
    db_url: str, key_name: str, expect: int, timeout: float = 10.0
) -> list[dict[str, Any]]:
    """The key's audit rows (oldest first) once `expect` of them are written."""
    db = open_database(db_url)
    deadline = time.monotonic() + timeout
    try:
        while True:
            rows = recent_rows(db, 1000, key_name)
            if len(rows) >= expect or time.monotonic() > deadline:
                return rows[::-1]
            time.sleep(0.1)
    finally:
        db.dispose()


def burst(
    gateway_urls: list[str], secret: str, n: int, **create: Any
) -> list[tuple[int, Any, Any]]:
    """`n` concurrent chat completions, call i to gateway_urls[i % len]; (status, headers, body)
    of each, in call order. A stream is read to its end (its body: the chunks), as a client
    that wants the answer does: one left unread is cut, a 499 charged its prompt."""

    async def run() -> list[tuple[int, Any, Any]]:
        clients = [
            openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=secret, max_retries=0)
            for url in gateway_urls
        ]

        async def one(client: openai.AsyncOpenAI) -> tuple[int, Any, Any]:
            try:
                raw = await client.chat.completions.with_raw_response.create(**create)
                body = raw.parse()
                if create.get("stream"):
                    body = [chunk async for chunk in body]
                return 200, raw.headers, body
            except openai.APIStatusError as err:
                return err.status_code, err.response.headers, err.body

        try:
            return await asyncio.gather(*(one(clients[i % len(clients)]) for i in range(n)))
        finally:
            for client in clients:
                await client.close()

    return asyncio.run(run())


def debian_binary(name: str, package: str) -> str:
    """The path of a program `make test` installs from Debian's `package` (as root). In CI
    its absence fails the test; elsewhere (no root to install it) the test is skipped."""
    found = shutil.which(name)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is missing: the test set-up installs Debian's {package}")
        pytest.skip(f"{name} not installed (apt-get install {package})")
    return found


def release_cli(config: Path, *args: str) -> str:
    """Run `inhouse release ...` on a gateway's config; its stdout (it must exit 0)."""
    done = subprocess.run(
        [*inhouse_command(), "release", *args, "--config", str(config)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def up_release_cli(env: dict[str, str], *args: str) -> str:
    """Run `inhouse release ...` against `inhouse up`'s database (its `INHOUSE_HOME` in
    `env`), with no config, as its users do; its stdout (it must exit 0)."""
    done = subprocess.run([*inhouse_command(), "release", *args], capture_output=True,
                          text=True, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def exception_chain(err: BaseException) -> str:
    """The exception classes of `err` and its causes, outermost first."""
    chain: list[str] = []
    cause: BaseException | None = err
    while cause is not None and len(chain) < 8:
        chain.append(f"{type(cause).__module__}.{type(cause).__qualname__}({cause})")
        cause = cause.__cause__ or cause.__context__
    return " <- ".join(chain)


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` still exists (a zombie counts until it is reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def nice_shortfall(leader: int, nice: int) -> tuple[list[int], int | None]:
    """How far each process of the session `leader` leads, and that session's autogroup,
    fall short of running `nice` steps below this process and its session (0: as asked;
    a nice caps at 19, so a caller already at 15 is owed only 4). The session's is None
    where the kernel groups no sessions here."""
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    shortfalls = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[3]) == leader:  # field 6, the session, two after ")"'s state and ppid
            shortfalls.append(min(ours + nice, 19) - int(fields[16]))  # field 19, nice
    group, theirs = _autogroup_nice("self"), _autogroup_nice(str(leader))
    if group is None or theirs is None:
        return shortfalls, None
    return shortfalls, min(group + nice, 19) - theirs


def _autogroup_nice(pid: str) -> int | None:
    """The nice of `pid`'s session autogroup; None where the kernel has no autogroups or the
    process sits in a cgroup's task group instead (the file is then empty), as in a container."""
    try:
        words = Path(f"/proc/{pid}/autogroup").read_text().split()
    except OSError:
        return None
    return int(words[-1]) if words else None
