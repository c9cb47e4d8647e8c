"""The `vllm serve` command `inhouse plan --cpu --emit vllm` prints starts vLLM's CPU backend
with no variable set by hand: the printed text is run as it is with `bash -c`, and the only
thing given to it is what a user who activated vLLM's venv has (its `bin` first on PATH).
Then the official openai client gets one chat answer from it.

Its time is one vLLM start on one core: 604 s cold on the loaded 2-core host (455 s of it
compiling); once inductor's cache holds the bundled model's graph, 137 s there and 58 s at
load average ~3, its compile 18 s (see docs/engines.md, start-up)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import openai
import pytest

from inhouse.launch.hf_folder import safetensors_folder
from inhouse.launch.vllm import find_vllm, installed_venv
from inhouse.manifests.bundled import default_chat_model
from serving import free_port, inhouse_command, log_tail, wait_healthy
from vllm_stack import vllm_environ

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

START_TIMEOUT_S = 1200  # a cold start (torch.compile) on one loaded core
STOP_TIMEOUT_S = 60


def test_the_printed_vllm_command_starts_and_answers(tmp_path: Path) -> None:
    vllm = find_vllm()
    if vllm is None:
        pytest.skip(f"vLLM is not installed: `make vllm` installs it into {installed_venv()}")
    folder = safetensors_folder(default_chat_model())  # the one `up --engine vllm` serves
    port = free_port()
    host = ["--cpu", "--ram", "2GiB", "--cores", "1", "--max-model-len", "2048"]
    plan = subprocess.run(
        [*inhouse_command(), "plan", str(folder), *host, "--emit", "vllm", "--port", str(port)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plan.returncode == 0, plan.stderr
    command = plan.stdout
    assert command.lstrip().startswith("VLLM_CPU_OMP_THREADS_BIND=0 ")
    # A user who ran `source <vLLM's venv>/bin/activate`: its bin directory first on PATH.
    env = vllm_environ(PATH=f"{vllm.parent}{os.pathsep}{os.environ['PATH']}")
    log = tmp_path / "vllm.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            ["bash", "-c", command],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", server, log, START_TIMEOUT_S)
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0
        )
        answer = client.chat.completions.create(
            model=str(folder),  # vLLM serves the model under the path it was given
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=16,
            temperature=0,
        )
        assert answer.choices[0].message.content
        assert answer.usage is not None and answer.usage.completion_tokens > 0
    finally:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    text = log.read_text(errors="replace")
    assert "Explicitly set" in text, log_tail(log)  # it took --kv-cache-memory-bytes
    assert "VLLM_CPU_OMP_THREADS_BIND='0'" in text, log_tail(log)
    # vLLM 0.32's AOT cache, which cannot load back on the CPU, is off: no start compiles
    # again for it (before VLLM_USE_AOT_COMPILE=0 every start after the first one did).
    assert "due to a load failure" not in text, log_tail(log)
