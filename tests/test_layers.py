"""The HTTP side stays light: the answer readers, the gateway and the bench never load the
engine, the server or torch."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "module", ["inhouse.api.answers", "inhouse.gateway.app", "inhouse.bench.command"]
)
def test_importing_pulls_in_neither_torch_engine_nor_server(module: str) -> None:
    code = (
        f"import sys, {module}; "
        "print(*(m in sys.modules for m in ('torch', 'inhouse.engine', 'inhouse.server')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]
