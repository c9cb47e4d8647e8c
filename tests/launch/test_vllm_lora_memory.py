"""The plan's vLLM adapter slot is what vLLM 0.32 allocates: its LoRA stacks for the bundled
model (tied embeddings: embed_tokens and lm_head both wrapped), summed inside a real vLLM
engine (`vllm_lora_bytes.py`, ~15 s, no compile), equal `vllm_slot_bytes` × slots."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from inhouse.launch.hf_folder import safetensors_folder
from inhouse.launch.vllm import find_vllm, installed_venv
from inhouse.manifests.bundled import default_chat_model
from inhouse.plan.adapters import vllm_slot_bytes
from inhouse.plan.source import load_model
from vllm_stack import vllm_environ

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PROBE = Path(__file__).with_name("vllm_lora_bytes.py")


def test_vllm_allocates_what_the_plan_counts() -> None:
    vllm = find_vllm()
    if vllm is None:
        pytest.skip(f"vLLM is not installed: `make vllm` installs it into {installed_venv()}")
    python = vllm.with_name("python")
    if not python.exists():
        pytest.skip(f"{vllm} is not in a virtual environment with its own python")
    folder = safetensors_folder(default_chat_model())
    slots, rank = 3, 8
    env = vllm_environ(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_USE_AOT_COMPILE="0")
    done = subprocess.run(
        [str(python), str(PROBE), str(folder), str(slots), str(rank)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (measured,) = re.findall(r"^LORA_BYTES (\d+)$", done.stdout, re.MULTILINE)
    assert int(measured) == slots * vllm_slot_bytes(load_model(str(folder)).spec, rank)
