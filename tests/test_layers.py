"""The layer contract (tests/layering.py) holds over src/inhouse, and the checker catches
each kind of break; the HTTP side also stays light when it is really imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from layering import SRC, violations


def test_the_source_tree_keeps_the_layer_contract() -> None:
    problems = violations(SRC)
    assert not problems, "the layer contract is broken:\n" + "\n".join(problems)


def _tree(base: Path, files: dict[str, str]) -> Path:
    """A small `inhouse` package under `base`: each path's module with its source."""
    root = base / "inhouse"
    for name, source in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        for folder in path.relative_to(root).parents:
            (root / folder / "__init__.py").touch()
        path.write_text(source)
    return root


def test_an_import_of_a_higher_layer_is_reported(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "plan/report.py": "def render():\n    import inhouse.server.app\n",
            "server/app.py": "from inhouse.plan import report\n",
        },
    )
    assert violations(root) == [
        "inhouse/plan/report.py:2: plan (layer 0) imports server (layer 2), a higher layer",
        "import cycle: plan -> server -> plan",
        "module import cycle: inhouse/plan/report.py, inhouse/server/app.py",
    ]


def test_a_relative_import_counts_like_an_absolute_one(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"engine/core.py": "", "api/chat.py": "from ..engine import core\n"})
    assert violations(root) == [
        "inhouse/api/chat.py:1: api (layer 0) imports engine (layer 1), a higher layer"
    ]


def test_a_circle_within_one_layer_is_reported(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "gateway/a.py": "from inhouse.eval import b\n",
            "eval/b.py": "from inhouse.bench import c\n",
            "bench/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from inhouse.gateway.a import x\n",
        },
    )
    assert violations(root) == [
        "import cycle: bench -> gateway -> eval -> bench",
        "module import cycle: inhouse/bench/c.py, inhouse/eval/b.py, inhouse/gateway/a.py",
    ]


def test_a_circle_of_modules_within_one_package_is_reported(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "gateway/call.py": "from inhouse.gateway import state\n",
            "gateway/state.py": "def f():\n    from .upstream import Clients\n",
            "gateway/upstream.py": "from inhouse.gateway.call import Call\n",
            "gateway/clients.py": "import json\n",
        },
    )
    assert violations(root) == [
        "module import cycle: inhouse/gateway/call.py, inhouse/gateway/state.py, "
        "inhouse/gateway/upstream.py"
    ]
    (root / "gateway/state.py").write_text("from inhouse.gateway.clients import json\n")
    assert violations(root) == []


def test_the_http_side_importing_the_engine_is_reported(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {"engine/core.py": "", "bench/run.py": "from inhouse.engine.core import EngineCore\n"},
    )
    assert violations(root) == ["inhouse/bench/run.py:1: bench must not import engine"]


def test_a_new_package_must_be_given_a_layer(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"extras/thing.py": ""})
    assert violations(root) == ["extras: a top-level package with no layer"]


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
