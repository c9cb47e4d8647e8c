"""`inhouse up --lora-modules support=ADAPTER` on the bundled model: `inhouse serve` started
with the adapter, the gateway declaring it, and the official openai client's greedy chat for
model "support" answers unlike the base's (the vLLM stack: test_up_vllm_lora.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import openai
import pytest

from lora_adapters import bundled_adapter
from serving import free_port, inhouse_command, log_tail, wait_healthy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MODEL = "SmolLM2-135M-Instruct"
START_TIMEOUT_S = 300


def test_up_serves_an_adapter_behind_the_gateway(tmp_path: Path) -> None:
    adapter = bundled_adapter(tmp_path / "support", seed=7)
    port, log = free_port(), tmp_path / "up.log"
    argv = [*inhouse_command(), "up", "--port", str(port), "--no-embeddings"]
    argv += ["--lora-modules", f"support={adapter}", "--max-lora-rank", "8"]
    env = {**os.environ, "INHOUSE_HOME": str(tmp_path / "home")}
    with open(log, "wb") as out:
        up = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", up, log, START_TIMEOUT_S)
        deadline = time.monotonic() + START_TIMEOUT_S
        while "replica inhouse:1 is ready" not in log.read_text():
            assert up.poll() is None and time.monotonic() < deadline, log_tail(log)
            time.sleep(1)
        (admin,) = re.findall(r"^ih-\S+$", log.read_text(), flags=re.MULTILINE)
        sdk = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=admin)
        assert "support" in [card.id for card in sdk.models.list().data]
        greedy = {"messages": [{"role": "user", "content": "Name three colours."}]}
        greedy |= {"temperature": 0, "max_tokens": 12}
        base = sdk.chat.completions.create(model=MODEL, **greedy)
        tuned = sdk.chat.completions.create(model="support", **greedy)
        assert tuned.choices[0].message.content and tuned.usage.completion_tokens >= 1
        assert tuned.choices[0].message.content != base.choices[0].message.content
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGINT)
            up.wait(timeout=60)
