"""`inhouse up`: a real serve process behind a real gateway, an admin key printed once."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import openai
import pytest
from typer.testing import CliRunner

from inhouse.cli import app
from inhouse.gateway.config import GatewayConfig
from inhouse.gateway.up import ensure_admin_key
from serving import free_port, inhouse_command, wait_healthy

pytest.importorskip("inhouse.server.app", reason="inhouse serve (issue 4) is not importable yet")


def test_admin_key_is_created_once(tmp_path: Path) -> None:
    config = GatewayConfig(models=(), database=f"sqlite:///{tmp_path / 'gateway.db'}")
    secret = ensure_admin_key(config)
    assert secret is not None and secret.startswith("ih-")
    assert ensure_admin_key(config) is None


@pytest.mark.slow
def test_up_serves_the_bundled_model_behind_the_gateway(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "up.log"
    env = {**os.environ, "INHOUSE_HOME": str(tmp_path / "home")}
    with open(log, "wb") as out:
        up = subprocess.Popen(
            [*inhouse_command(), "up", "--port", str(port), "--no-embeddings"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", up, log, 300)
        secrets = re.findall(r"^ih-\S+$", log.read_text(), flags=re.MULTILINE)
        assert len(secrets) == 1
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=secrets[0])
        reply = client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=2,
        )
        assert reply.usage.completion_tokens >= 1
        serve_args = subprocess.run(
            ["ps", "-eo", "args"], capture_output=True, text=True, check=True
        ).stdout
        assert "--api-key" not in "".join(
            line for line in serve_args.splitlines() if f"--port {port}" in line
        )
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
    assert up.returncode == 0, log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()
    pids = [int(p) for p in re.findall(r"^replica inhouse:1: pid (\d+) ", log.read_text(), re.M)]
    assert len(pids) == 1
    with pytest.raises(ProcessLookupError):  # Ctrl-C stopped the replica too
        os.kill(pids[0], 0)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_missing_engine_is_one_sentence_and_exit_2(engine: str) -> None:
    result = CliRunner().invoke(app, ["up", "--engine", engine])
    assert result.exit_code == 2
    assert f"pip install {engine}" in result.output and "Traceback" not in result.output


def test_unknown_engine_and_tp_without_a_gpu_are_refused() -> None:
    unknown = CliRunner().invoke(app, ["up", "--engine", "tgi"])
    assert unknown.exit_code == 2 and "--engine takes one of" in unknown.output
    tp = CliRunner().invoke(app, ["up", "--engine", "inhouse", "--tp", "2"])
    assert tp.exit_code == 2 and "--tp needs --gpu or --vram" in tp.output
