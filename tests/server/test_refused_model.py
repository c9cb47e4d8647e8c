"""A model `inhouse serve` cannot serve as given ends the process: exit 1 and one line on
stderr saying why, no traceback, instead of a server whose /health says 503 forever."""

from __future__ import annotations

import dataclasses
import json
import pickle
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from inhouse.manifests.bundled import default_chat_model
from inhouse.manifests.verify import lock
from inhouse.server.serve import EXIT_LOAD_FAILED
from serving import free_port, inhouse_command

pytestmark = pytest.mark.slow

EXIT_TIMEOUT_S = 240  # imports torch and reads the files first; a hang fails the test


def _pickle_only(tmp: Path) -> list[str]:
    folder = tmp / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"weight": [0.0]}))
    return [str(folder)]


def _bad_config(tmp: Path) -> list[str]:
    folder = tmp / "bad-config"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama", ')
    (folder / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    return [str(folder)]


def _missing(tmp: Path) -> list[str]:
    return [str(tmp / "no-such-model")]


def _manifest(tmp: Path, **changes: str) -> list[str]:
    pinned = dataclasses.replace(lock(default_chat_model()), **changes)
    path = tmp / "inhouse.model.toml"
    path.write_text(pinned.to_toml())
    return ["--manifest", str(path)]


def _not_an_adapter(tmp: Path) -> list[str]:
    return ["--lora-modules", f"support={tmp}"]


def _tampered_dtype(tmp: Path) -> list[str]:
    return _manifest(tmp, dtype="float64")


def _tampered_hash(tmp: Path) -> list[str]:
    manifest = lock(default_chat_model())
    files = {name: "0" * 64 for name in manifest.files}
    return _manifest(tmp, files=files)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (_pickle_only, "pickle-based weights (pytorch_model.bin) are refused"),
        (_bad_config, "config.json' is not a valid JSON file"),
        (_missing, "no-such-model' is neither a .gguf file nor a folder with config.json"),
        (_tampered_dtype, "unknown dtype 'float64'"),
        (_not_an_adapter, "is not a PEFT LoRA adapter"),
        (_tampered_hash, "does not match manifest"),
    ],
)
def test_a_model_that_cannot_be_served_exits_with_one_line(
    tmp_path: Path, model: Callable[[Path], list[str]], reason: str
) -> None:
    args = [*inhouse_command(), "serve", *model(tmp_path), "--port", str(free_port())]
    done = subprocess.run(
        [*args, "--embedding-model", "none"],
        capture_output=True,
        text=True,
        timeout=EXIT_TIMEOUT_S,
    )
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == EXIT_LOAD_FAILED, done.stderr
    assert len(lines) == 1, done.stderr
    assert reason in lines[0] and "Traceback" not in done.stderr + done.stdout
