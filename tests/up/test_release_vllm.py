"""A release canary from an inhouse-engine stable to a real vLLM candidate and back, as a
user of `inhouse up` does it: `inhouse up` (the inhouse engine, release 1 of the bundled
model), then `inhouse release canary MODEL --percent 50 --backend <vLLM URL> --kind vllm
--upstream-model ...` against the gateway's database (no config), traffic from keys of
each priority class with the official openai client, `inhouse release compare`, and
`inhouse release rollback`; first a candidate whose key variable the gateway lacks, which
no client notices and the guardrail drops. The vLLM replica is one of the session's
`up_vllm` stack."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

from inhouse.gateway.db_open import open_database
from inhouse.gateway.releases.store import ReleaseStore
from serving import (
    audit_rows,
    free_port,
    inhouse_command,
    log_tail,
    pid_alive,
    up_release_cli,
    wait_healthy,
)
from vllm_stack import MODEL, finished_requests, make_key, replica_key, replicas

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

CANDIDATE_KEY_ENV = "VLLM_CANDIDATE_KEY"  # where the gateway finds the vLLM replica's key
UNSET_KEY_ENV = "INHOUSE_TEST_UNSET_KEY"  # a variable the gateway lacks
GUARD_WAIT_S = 60  # the guardrail's 10 s interval, the health checks' 3 failures, a load
STABLE_START_S = 300
# With the admin key, one key of each class (the canary draws half of them for vLLM).
KEY_CLASSES = {"admin": "default", "ana": "interactive", "bo": "batch", "cy": "default"}
ASK: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                       "max_tokens": 8}  # fmt: skip


def _wait_for(log: Path, pattern: str, process: subprocess.Popen, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text(), flags=re.MULTILINE)
        if found:
            return found.group(0)
        assert process.poll() is None, log_tail(log)
        time.sleep(0.3)
    pytest.fail(f"{pattern!r} not in the log after {timeout} s:\n{log_tail(log)}")


def _make_keys(env: dict[str, str]) -> dict[str, str]:
    """`inhouse keys create` of each key but the admin one, at once; their secrets."""
    made = [n for n in KEY_CLASSES if n != "admin"]
    with ThreadPoolExecutor(len(made)) as pool:
        secrets = pool.map(lambda n: make_key({"env": env}, n, KEY_CLASSES[n]), made)
        return dict(zip(made, secrets, strict=True))


def _ask_both_ways(gateway: str, secret: str) -> list[tuple[int, int]]:
    """A chat and a stream with usage; (prompt, completion) tokens of each, as the client got
    them."""
    sdk = openai.OpenAI(base_url=f"{gateway}/v1", api_key=secret, max_retries=0)
    reply = sdk.chat.completions.create(**ASK)
    assert reply.choices[0].message.content and reply.usage is not None
    chunks = list(
        sdk.chat.completions.create(**ASK, stream=True, stream_options={"include_usage": True})
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert usage is not None and 1 <= usage.completion_tokens <= 8
    return [(reply.usage.prompt_tokens, reply.usage.completion_tokens),
            (usage.prompt_tokens, usage.completion_tokens)]  # fmt: skip


def test_canary_to_a_vllm_candidate_then_rollback(up_vllm: dict, tmp_path: Path) -> None:
    started = time.monotonic()
    live = [(pid, url) for pid, url in replicas(up_vllm["log"]).values() if pid_alive(pid)]
    assert live, f"no vLLM replica left:\n{log_tail(up_vllm['log'])}"
    pid, vllm_url = live[0]
    env = {**os.environ, "INHOUSE_HOME": str(tmp_path / "home"),
           CANDIDATE_KEY_ENV: replica_key(pid)}  # fmt: skip
    env.pop(UNSET_KEY_ENV, None)
    port, log = free_port(), tmp_path / "up.log"
    argv = [*inhouse_command(), "up", "--port", str(port), "--no-embeddings",
            "--max-model-len", "2048"]  # fmt: skip
    with open(log, "wb") as out:
        up = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    gateway, database = f"http://127.0.0.1:{port}", _database(env)
    vllm_name = vllm_url.split("://")[1]  # an URL backend's name in the audit
    try:
        # The gateway's database exists once the admin key is printed: the keys and the
        # first canary are made while the stable replica loads.
        _wait_for(log, rf"^Stable release 1 of '{MODEL}'", up, STABLE_START_S)
        secrets = {"admin": _wait_for(log, r"^ih-\S+$", up, 1), **_make_keys(env)}
        # 1. A candidate whose key variable the gateway lacks: vLLM refuses the gateway
        # (401), its keys are answered by the stable, and the guardrail drops it.
        canary = _canary(env, vllm_url, UNSET_KEY_ENV, "vLLM candidate, key unset")
        assert "stable release 1, candidate release 2 at 50% of keys" in canary
        wait_healthy(f"{gateway}/health", up, log, STABLE_START_S)
        _wait_for(log, r"^replica inhouse:1 is ready", up, STABLE_START_S)
        usage = {name: _ask_both_ways(gateway, secret) for name, secret in secrets.items()}
        for name in secrets:
            assert _answered(database, name, 0) == [(1, "inhouse:1", 200)] * 2
        _wait_for(log, rf"\${UNSET_KEY_ENV} is not set in the gateway's environment", up, 1)
        _wait_until_rolled_back(database)

        # 2. The candidate with its key: half the keys on vLLM, each key on one release.
        canary = _canary(env, vllm_url, CANDIDATE_KEY_ENV, "vLLM candidate")
        assert "stable release 1, candidate release 3 at 50% of keys" in canary
        vllm_before = finished_requests(vllm_url)
        for name, secret in secrets.items():
            usage[name] += _ask_both_ways(gateway, secret)
        release_of: dict[str, int] = {}
        for name in secrets:
            rows = audit_rows(database, name, 4)[2:]
            assert [(r["prompt_tokens"], r["completion_tokens"]) for r in rows] == usage[name][2:]
            assert [r["priority"] for r in rows] == [KEY_CLASSES[name]] * 2
            (release_of[name],) = {r["release"] for r in rows}  # sticky: one release a key
            want = (release_of[name], {3: vllm_name, 1: "inhouse:1"}[release_of[name]], 200)
            assert _answered(database, name, 2) == [want] * 2, name
        on_vllm = [n for n, release in release_of.items() if release == 3]
        assert on_vllm and len(on_vllm) < len(secrets), release_of  # both releases answered
        # vLLM's own count: it finished the candidate's requests (its health probes add more).
        assert finished_requests(vllm_url) - vllm_before >= 2 * len(on_vllm)
        access = re.findall(rf"release={re.escape(MODEL)}@(\d)$", log.read_text(), re.MULTILINE)
        assert {"1", "3"} <= set(access)

        png = tmp_path / "compare.png"
        live = json.loads(up_release_cli(env, "compare", MODEL, "--json", "--png", str(png)))
        live = live["live"]
        assert (live["stable"]["release"], live["candidate"]["release"]) == (1, 3)
        assert live["candidate"]["requests"] == 2 * len(on_vllm)
        assert live["stable"]["requests"] == 2 * (len(secrets) - len(on_vllm))
        assert live["candidate"]["errors"]["k"] == 0 and live["candidate"]["ttft_ms"]["n"] >= 1
        assert png.stat().st_size > 0

        # 3. Back: every later request answered by the stable.
        rolled = up_release_cli(env, "rollback", MODEL, "--by", "ops", "--reason",
                                "back to the inhouse engine")  # fmt: skip
        assert f"{MODEL}: stable release 1 ·" in rolled
        for name, secret in secrets.items():
            usage[name] += _ask_both_ways(gateway, secret)
        for name in secrets:
            assert _answered(database, name, 4) == [(1, "inhouse:1", 200)] * 2, name
            rows = audit_rows(database, name, 6)[4:]
            assert [(r["prompt_tokens"], r["completion_tokens"]) for r in rows] == usage[name][4:]

        status = json.loads(up_release_cli(env, "status", MODEL, "--json"))
        assert (status["state"]["stable"], status["state"]["candidate"]) == (1, None)
        changes = [(e["actor"], e["action"], e["release"], e["reason"])
                   for e in reversed(status["events"])]  # fmt: skip
        assert changes == [
            ("inhouse up", "create", 1, None),
            ("ops", "create", 2, None),
            ("ops", "canary", 2, "vLLM candidate, key unset"),
            ("guardrail", "auto_rollback", 2, "guardrail: candidate_down"),
            ("ops", "create", 3, None),
            ("ops", "canary", 3, "vLLM candidate"),
            ("ops", "rollback", 3, "back to the inhouse engine"),
        ]
        (candidate,) = [r for r in status["releases"] if r["number"] == 3]
        assert candidate["backends"] == [{"name": vllm_name, "url": vllm_url, "kind": "vllm",
                                          "model": MODEL,
                                          "api_key_env": CANDIDATE_KEY_ENV}]  # fmt: skip
        print(f"canary to vLLM and back in {time.monotonic() - started:.0f} s")
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
    assert up.returncode == 0, log_tail(log)
    assert "Traceback" not in log.read_text()


def _canary(env: dict[str, str], vllm_url: str, key_env: str, reason: str) -> str:
    """`inhouse release canary` of the vLLM replica for half the keys."""
    return up_release_cli(env, "canary", MODEL, "--percent", "50", "--backend", vllm_url,
                          "--kind", "vllm", "--upstream-model", MODEL, "--api-key-env",
                          key_env, "--by", "ops", "--reason", reason)  # fmt: skip


def _answered(database: str, key: str, skip: int) -> list[tuple[int, str, int]]:
    """(release, backend, status) of the key's two audit rows after its first `skip`."""
    rows = audit_rows(database, key, skip + 2)[skip:]
    return [(r["release"], r["backend"], r["status"]) for r in rows]


def _wait_until_rolled_back(database: str) -> None:
    """Until the guardrail has dropped the candidate (it checks every 10 s)."""
    store = ReleaseStore(open_database(database))
    deadline = time.monotonic() + GUARD_WAIT_S
    while (state := store.state(MODEL)) is not None and state.candidate is not None:
        assert time.monotonic() < deadline, f"the candidate is still there: {state}"
        time.sleep(0.5)
    store.db.dispose()


def _database(env: dict[str, str]) -> str:
    """The gateway database `inhouse up` keeps in its home."""
    return f"sqlite:///{Path(env['INHOUSE_HOME']) / 'gateway.db'}"
