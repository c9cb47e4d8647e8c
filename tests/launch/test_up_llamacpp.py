"""`inhouse up --engine llama.cpp --replicas 2` end to end: the real llama-server (built by
`make llama-server`) on the bundled GGUF, the real gateway, the official openai client,
`inhouse bench run`; and the launcher's process handling with the same binary."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from inhouse.gateway.backends import read_load
from inhouse.launch.base import Endpoint, Health, LaunchSettings
from inhouse.launch.documented import documented_options
from inhouse.launch.llamacpp import LlamaCppEngine, find_llama_server
from inhouse.launch.replicas import start_replica, stop_replicas, wait_started
from inhouse.manifests.bundled import default_chat_model
from serving import audit_rows, free_port, inhouse_command, log_tail, pid_alive, wait_healthy

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct"
UP_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def llama_server() -> Path:
    binary = find_llama_server()
    if binary is None:
        pytest.fail("llama-server is not built: run `make llama-server`")
    return binary


def truncated_gguf(folder: Path) -> Path:
    """The bundled GGUF with its header intact and its tensor data cut short."""
    data = default_chat_model().read_bytes()
    broken = folder / "broken.gguf"
    broken.write_bytes(data[: len(data) * 9 // 10])
    return broken


def replica_pids(log: Path) -> dict[str, int]:
    found = re.findall(r"^replica (\S+): pid (\d+) on ", log.read_text(), flags=re.MULTILINE)
    return {label: int(pid) for label, pid in found}


def backend_states(gateway: str) -> dict[str, str]:
    backends = httpx.get(f"{gateway}/health", timeout=5).json()["models"][MODEL]["backends"]
    return {b["name"]: b["state"] for b in backends}


def up_process(
    tmp_path: Path, port: int, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp_path / "up.log"
    env = {**os.environ, "INHOUSE_HOME": str(tmp_path / "home"), **(env or {})}
    argv = [*inhouse_command(), "up", "--engine", "llama.cpp", "--port", str(port), *args]
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    return process, log


def cli(tmp_path: Path, *args: str) -> str:
    env = {**os.environ, "INHOUSE_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [*inhouse_command(), *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_emitted_options_are_in_the_real_binarys_help(llama_server: Path) -> None:
    help_text = subprocess.run(
        [str(llama_server), "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    engine = LlamaCppEngine()
    settings = LaunchSettings(
        "m.gguf",
        gguf=True,
        max_model_len=4096,
        max_num_seqs=8,
        max_num_batched_tokens=2048,
        kv_cache_tokens=32768,
        kv_dtype="int8",
        tp=2,
        gpu=True,
    )
    flags = engine.flags(settings)
    engine.serving_flags(Endpoint("127.0.0.1", 1, "m", "k"), flags)
    options = {token for token in flags.argv if token.startswith("-")}
    assert options <= set(documented_options("llama.cpp.txt"))
    assert {o for o in options if not re.search(rf"(^|[\s,]){re.escape(o)}\b", help_text)} == set()


def test_launcher_with_the_real_llama_server(llama_server: Path, tmp_path: Path) -> None:
    engine = LlamaCppEngine()
    out = io.StringIO()
    replicas = []
    for index, model in enumerate((default_chat_model(), truncated_gguf(tmp_path)), start=1):
        settings = LaunchSettings(str(model), gguf=True, max_model_len=512, max_num_seqs=2)
        endpoint = Endpoint("127.0.0.1", free_port(), "m", api_key="k")
        command = engine.command(settings, endpoint)
        replicas.append(start_replica(engine, command, endpoint, index, out))
    try:
        with httpx.Client() as client:
            assert replicas[0].probe(client) is Health.LOADING  # not listening yet: starting
        states = wait_started(replicas, poll_s=0.2)
        assert states == {"llama.cpp:1": Health.READY, "llama.cpp:2": Health.FAILED}
        assert "exited with status" in replicas[1].failure()
        page = httpx.get(f"{replicas[0].url}/metrics", headers={"Authorization": "Bearer k"})
        assert page.status_code == 200 and "llamacpp:requests_deferred" in page.text
        assert read_load(page.text, "llama.cpp") == (0.0, 0.0)
    finally:
        stop_replicas(replicas)
    assert replicas[0].popen.returncode is not None and not pid_alive(replicas[0].popen.pid)


def test_up_exits_when_no_replica_starts(llama_server: Path, tmp_path: Path) -> None:
    # llama-server reads LLAMA_ARG_* from the environment: a bad one stops it at start.
    bad = {"LLAMA_ARG_CACHE_TYPE_K": "bogus"}
    up, log = up_process(tmp_path, free_port(), "--replicas", "2", env=bad)
    try:
        up.wait(timeout=UP_TIMEOUT_S)
    finally:
        up.kill()
    text = log.read_text()
    assert up.returncode == 1, log_tail(log)
    assert "no replica started" in text and "llama.cpp:2 exited with status" in text
    pids = replica_pids(log)
    assert len(pids) == 2 and not any(pid_alive(pid) for pid in pids.values())


def test_a_checkpoint_folder_is_refused(llama_server: Path, tmp_path: Path) -> None:
    config = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4}
    config |= {"num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256}
    config |= {"max_position_embeddings": 2048, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(config | {"model_type": "llama"}))
    up, log = up_process(tmp_path, free_port(), str(tmp_path))
    assert up.wait(timeout=120) == 2
    assert "GGUF files only" in log.read_text() and "replica" not in log.read_text()


@pytest.fixture(scope="module")
def up_two(llama_server: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    yield from running_up(tmp_path_factory.mktemp("up"))


def running_up(tmp_path: Path) -> Iterator[dict]:
    """`inhouse up` with two llama.cpp replicas, once both are up; stopped afterwards."""
    port = free_port()
    up, log = up_process(
        tmp_path, port, "--replicas", "2", "--max-model-len", "1024", "--max-num-seqs", "4"
    )
    gateway = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{gateway}/health", up, log, UP_TIMEOUT_S)
        deadline = time.monotonic() + 60  # one health round after both loaded
        while set(backend_states(gateway).values()) != {"up"} and time.monotonic() < deadline:
            time.sleep(0.5)
        assert set(backend_states(gateway).values()) == {"up"}, log_tail(log)
        admin = re.findall(r"^ih-\S+$", log.read_text(), flags=re.MULTILINE)[0]
        yield {"up": up, "log": log, "gateway": gateway, "admin": admin, "home": tmp_path}
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            up.wait(timeout=60)


def test_chat_stream_limits_revoke_both_replicas_failover_and_bench(up_two: dict) -> None:
    gateway, home, log = up_two["gateway"], up_two["home"], up_two["log"]
    admin = openai.OpenAI(base_url=f"{gateway}/v1", api_key=up_two["admin"], max_retries=0)
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
    reply = admin.chat.completions.create(**ask)
    assert reply.choices[0].message.content and reply.usage.completion_tokens >= 1
    chunks = list(
        admin.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True})
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1

    # One request a minute: the second, seconds later, is refused however slow the first was.
    secret = cli(home, "keys", "create", "alice", "--rpm", "1").strip().splitlines()[-1]
    alice = openai.OpenAI(base_url=f"{gateway}/v1", api_key=secret, max_retries=0)
    alice.chat.completions.create(**ask)
    with pytest.raises(openai.RateLimitError) as limited:
        alice.chat.completions.create(**ask)
    assert int(limited.value.response.headers["retry-after"]) >= 1
    cli(home, "keys", "revoke", "alice")
    with pytest.raises(openai.AuthenticationError):
        alice.chat.completions.create(**ask)

    for _ in range(6):
        admin.chat.completions.create(**ask)
    database = f"sqlite:///{home / 'home' / 'gateway.db'}"
    rows = audit_rows(database, "admin", expect=8)
    assert {r["backend"] for r in rows if r["status"] == 200} == {"llama.cpp:1", "llama.cpp:2"}

    os.kill(replica_pids(log)["llama.cpp:1"], signal.SIGKILL)
    for _ in range(4):
        admin.chat.completions.create(**ask)
    rows = audit_rows(database, "admin", expect=12)[8:]
    assert [(r["status"], r["backend"]) for r in rows] == [(200, "llama.cpp:2")] * 4
    deadline = time.monotonic() + 10
    while "replica llama.cpp:1 exited" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "replica llama.cpp:1 exited with status -9" in log.read_text()

    out = home / "bench"
    target = ["--base-url", gateway, "--model", MODEL, "--api-key", up_two["admin"]]
    load = ["--max-concurrency", "2", "--num-prompts", "6", "--input-len", "32"]
    load += ["--output-len", "16", "--warmup", "1", "--out", str(out)]
    subprocess.run(
        [*inhouse_command(), "bench", "run", *target, *load],
        check=True,
        capture_output=True,
        timeout=300,
    )
    summary = json.loads((out / "results.json").read_text())["runs"][0]["summary"]
    assert summary["completed"] == 6 and summary["failed"] == 0
    # Sane, not fast: this 2-core CI machine is shared, so only the order of things is held.
    assert 0 < summary["ttft"]["p50"] < 30 and 0 < summary["tpot"]["p50"] < 5
    assert summary["e2e"]["p50"] >= summary["ttft"]["p50"]
    assert summary["output_throughput"] > 0 and summary["total_output_tokens"] >= 6


def test_ctrl_c_stops_the_gateway_and_every_replica(llama_server: Path, tmp_path: Path) -> None:
    started = running_up(tmp_path)  # its own: the other tests share one that must stay up
    up, log = (running := next(started))["up"], running["log"]
    up.send_signal(signal.SIGINT)
    assert up.wait(timeout=60) == 0, log_tail(log)
    assert "Traceback" not in log.read_text()
    assert not any(pid_alive(pid) for pid in replica_pids(log).values())
    started.close()
