"""The session's vLLM stack, shared by every module that talks to it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from inhouse.launch.vllm import find_vllm, installed_venv
from vllm_stack import running_up_vllm


@pytest.fixture(scope="session")
def up_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """One `inhouse up --engine vllm --replicas 2` for the session (see `vllm_stack`)."""
    if find_vllm() is None:
        pytest.skip(f"vLLM is not installed: `make vllm` installs it into {installed_venv()}")
    with running_up_vllm(tmp_path_factory.mktemp("up-vllm")) as up:
        yield up
