"""The launcher's process handling with real `inhouse serve` processes: a cold start is
loading (not dead), a replica whose model cannot load is a failed start with its log,
and stopping leaves no process behind."""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import pytest

from inhouse.launch.base import Endpoint, Health, LaunchSettings
from inhouse.launch.inhouse import InhouseEngine
from inhouse.launch.replicas import start_replica, stop_replicas, wait_started
from inhouse.manifests.bundled import default_chat_model
from serving import free_port

pytestmark = pytest.mark.slow


def test_cold_start_ready_broken_replica_failed_and_stop(tmp_path: Path) -> None:
    engine = InhouseEngine()
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(default_chat_model().read_bytes()[: 1 << 20])  # header, no tensors
    out = io.StringIO()
    replicas = []
    for index, model in enumerate((str(default_chat_model()), str(broken)), start=1):
        settings = LaunchSettings(
            model=model, gguf=True, max_model_len=512, kv_cache_bytes=32 << 20
        )
        endpoint = Endpoint("127.0.0.1", free_port(), f"m{index}", api_key="k")
        replicas.append(
            start_replica(engine, engine.command(settings, endpoint), endpoint, index, out)
        )
    try:
        with httpx.Client() as client:
            assert replicas[0].probe(client) is Health.LOADING  # seconds of loading ahead
        states = wait_started(replicas, poll_s=0.2)
        assert states == {"inhouse:1": Health.READY, "inhouse:2": Health.FAILED}
        failure = replicas[1].failure()
        assert failure.startswith("replica inhouse:2 ") and "log ended with" in failure
        assert "[inhouse:1] " in out.getvalue() and "[inhouse:2] " in out.getvalue()
        reply = httpx.get(f"{replicas[0].url}/v1/models", headers={"Authorization": "Bearer k"})
        assert reply.status_code == 200 and reply.json()["data"][0]["id"] == "m1"
    finally:
        stop_replicas(replicas)
    assert all(r.popen.poll() is not None for r in replicas)
