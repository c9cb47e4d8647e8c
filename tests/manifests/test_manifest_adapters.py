"""LoRA adapters in a model manifest, on real files: lock → TOML → read → verify round-trips
with each adapter's files and digest, a changed adapter byte is named under the adapter's
name, a folder that is not PEFT's is refused, and the CLI pins adapters (`models lock
--lora-modules`) that `models verify` and `serve --manifest` check before anything loads."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from inhouse.launch.inhouse import inhouse_command
from inhouse.manifests.hashing import HashCache
from inhouse.manifests.manifest import ManifestError, read_manifest
from inhouse.manifests.verify import lock, lock_adapter, verify


def _folder(path: Path, config: tuple[str, str], weights: str, seed: int) -> Path:
    """A folder with a JSON config file and random safetensors weights."""
    path.mkdir(parents=True)
    (path / config[0]).write_text(config[1])
    tensor = np.random.default_rng(seed).standard_normal((16, 8)).astype(np.float32)
    save_file({"w": tensor}, path / weights)
    return path


@pytest.fixture
def model(tmp_path: Path) -> Path:
    config = ("config.json", '{"model_type": "llama"}')
    return _folder(tmp_path / "tiny-model", config, "model.safetensors", 0)


@pytest.fixture
def adapters(tmp_path: Path) -> dict[str, Path]:
    config = ("adapter_config.json", json.dumps({"peft_type": "LORA", "r": 8}))
    return {
        name: _folder(tmp_path / "adapters" / name, config, "adapter_model.safetensors", seed)
        for seed, name in enumerate(("support", "support-v2"), start=1)
    }


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    time.sleep(0.02)  # past the file system's mtime granularity, as between two real edits
    path.write_bytes(bytes(data))


def test_adapters_round_trip_and_a_changed_byte_is_named_under_the_adapter(
    tmp_path: Path, model: Path, adapters: dict[str, Path]
) -> None:
    cache = HashCache(tmp_path / "cache.json")
    pinned = lock(model, revision="v1", cache=cache)
    pins = tuple(lock_adapter(name, path, cache) for name, path in adapters.items())
    path = tmp_path / "inhouse.model.toml"
    path.write_text(dataclasses.replace(pinned, adapters=pins).to_toml())
    read = read_manifest(path)
    assert [a.name for a in read.adapters] == ["support", "support-v2"]
    assert [a.files for a in read.adapters] == [a.files for a in pins]
    assert sorted(read.adapters[0].files) == ["adapter_config.json", "adapter_model.safetensors"]
    revisions = {a.revision for a in read.adapters}
    assert len(revisions) == 2 and all(r.startswith("sha256:") for r in revisions)
    assert verify(read, cache) == []
    _flip_last_byte(adapters["support-v2"] / "adapter_model.safetensors")
    assert [str(p).split(" (")[0] for p in verify(read, cache)] == [
        "support-v2/adapter_model.safetensors: changed"
    ]


def test_a_folder_without_peft_config_and_a_broken_adapters_table_are_refused(
    tmp_path: Path, model: Path
) -> None:
    with pytest.raises(ManifestError, match=r"has no adapter_config\.json"):
        lock_adapter("support", model)
    path = tmp_path / "m.toml"
    sha = "0" * 64
    head = f'[model]\nname = "x"\nsource = "."\nrevision = "r"\n[files]\n"a" = "{sha}"\n'
    path.write_text(head + '[adapters.support]\nsource = "s"\nrevision = "r"\n')
    with pytest.raises(ManifestError, match=r"\[adapters.support\] needs a source"):
        read_manifest(path)
    path.write_text(head + '[adapters.support]\nsource = "s"\nrevision = "r"\n'
                    '[adapters.support.files]\n"w" = "zz"\n')  # fmt: skip
    with pytest.raises(ManifestError, match=r"\[adapters.support\] files 'w' is not a sha256"):
        read_manifest(path)


def _inhouse(*args: str, cache_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "INHOUSE_CACHE": str(cache_dir)}
    return subprocess.run(
        [*inhouse_command(), *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_cli_lock_pins_adapters_that_verify_and_serve_check(
    tmp_path: Path, model: Path, adapters: dict[str, Path]
) -> None:
    manifest, cache_dir = tmp_path / "inhouse.model.toml", tmp_path / "cache"
    modules = [arg for name, path in adapters.items()
               for arg in ("--lora-modules", f"{name}={path}")]  # fmt: skip
    locked = _inhouse("models", "lock", str(model), "--out", str(manifest), *modules,
                      cache_dir=cache_dir)  # fmt: skip
    assert locked.returncode == 0, locked.stderr
    assert "and 2 adapter(s)" in locked.stdout
    read = read_manifest(manifest)
    assert [a.source for a in read.adapters] == ["adapters/support", "adapters/support-v2"]
    assert [a.source_path() for a in read.adapters] == list(adapters.values())
    verified = _inhouse("models", "verify", str(manifest), cache_dir=cache_dir)
    assert verified.returncode == 0, verified.stderr
    twice = _inhouse("models", "lock", str(model), "--out", str(manifest), *modules[:2],
                     *modules[:2], cache_dir=cache_dir)  # fmt: skip
    assert twice.returncode == 2 and "give each adapter once" in twice.stderr
    _flip_last_byte(adapters["support"] / "adapter_model.safetensors")
    refused = _inhouse("models", "verify", str(manifest), cache_dir=cache_dir)
    assert refused.returncode == 1
    assert "support/adapter_model.safetensors: changed" in refused.stderr
    served = _inhouse("serve", "--manifest", str(manifest), "--port", "1", cache_dir=cache_dir)
    assert served.returncode == 1 and "support/adapter_model.safetensors: changed" in served.stderr
