"""Model manifests on real files: lock → verify round-trips, a one-byte change is named, the
hash cache is invalidated by a change, pickle files are refused, and `inhouse serve` refuses
to start on a tampered file before it loads anything."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from inhouse.launch.inhouse import inhouse_command
from inhouse.manifests.hashing import HashCache, file_sha256
from inhouse.manifests.manifest import ManifestError, read_manifest
from inhouse.manifests.pickles import PickleRefused
from inhouse.manifests.verify import lock, require_verified, verify


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """An HF-shaped folder: config, tokenizer files and real safetensors weights."""
    model = tmp_path / "tiny-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    (model / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {}}))
    rng = np.random.default_rng(0)
    save_file({"w": rng.standard_normal((64, 8)).astype(np.float32)}, model / "model.safetensors")
    (model / "README.md").write_text("not a model file: not pinned")
    return model


@pytest.fixture
def cache(tmp_path: Path) -> HashCache:
    return HashCache(tmp_path / "cache" / "hashes.json")


def _flip_one_byte(path: Path, offset: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    time.sleep(0.02)  # past the file system's mtime granularity, as between two real edits
    path.write_bytes(bytes(data))


def _write(tmp_path: Path, folder: Path, cache: HashCache) -> Path:
    manifest = lock(folder, revision="v1", cache=cache)
    path = tmp_path / "inhouse.model.toml"
    path.write_text(manifest.to_toml())
    return path


def test_lock_then_verify_round_trips(tmp_path: Path, folder: Path, cache: HashCache) -> None:
    path = _write(tmp_path, folder, cache)
    manifest = read_manifest(path)
    assert manifest.name == "tiny-model" and manifest.revision == "v1"
    assert sorted(manifest.files) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert manifest.files["model.safetensors"] == file_sha256(folder / "model.safetensors")
    assert verify(manifest, cache) == []
    assert verify(manifest, HashCache(tmp_path / "fresh.json", trust=False)) == []


def test_default_revision_is_a_digest_of_the_files(folder: Path, cache: HashCache) -> None:
    first = lock(folder, cache=cache).revision
    assert first.startswith("sha256:") and lock(folder, cache=cache).revision == first
    _flip_one_byte(folder / "config.json", 3)
    assert lock(folder, cache=cache).revision != first


def test_one_changed_byte_is_named(tmp_path: Path, folder: Path, cache: HashCache) -> None:
    manifest = read_manifest(_write(tmp_path, folder, cache))
    _flip_one_byte(folder / "model.safetensors")
    problems = verify(manifest, cache)
    assert [(p.file, p.kind) for p in problems] == [("model.safetensors", "changed")]
    with pytest.raises(ManifestError, match=r"model\.safetensors: changed"):
        require_verified(manifest, cache)


def test_missing_and_unexpected_files_are_named(
    tmp_path: Path, folder: Path, cache: HashCache
) -> None:
    manifest = read_manifest(_write(tmp_path, folder, cache))
    (folder / "tokenizer.json").unlink()
    (folder / "special_tokens_map.json").write_text("{}")
    found = {(p.file, p.kind) for p in verify(manifest, cache)}
    assert found == {("tokenizer.json", "missing"), ("special_tokens_map.json", "unexpected")}


def test_hash_cache_skips_unchanged_files_and_rehashes_changed_ones(
    folder: Path, tmp_path: Path
) -> None:
    weights = folder / "model.safetensors"
    first = HashCache(tmp_path / "hashes.json")
    original = first.sha256(weights)
    assert first.hashed == [weights]
    again = HashCache(tmp_path / "hashes.json")  # a later process reads the cache file
    read: list[int] = []
    assert again.sha256(weights, read.append) == original
    assert again.hashed == [] and read == [weights.stat().st_size]  # progress still advances
    _flip_one_byte(weights)
    assert again.sha256(weights) != original
    assert again.hashed == [weights]


def test_pickle_files_are_refused(tmp_path: Path, folder: Path, cache: HashCache) -> None:
    manifest = read_manifest(_write(tmp_path, folder, cache))
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(PickleRefused, match=r"pytorch_model\.bin.*unpickling runs arbitrary code"):
        lock(folder, cache=cache)
    assert [(p.file, p.kind) for p in verify(manifest, cache)] == [("pytorch_model.bin", "pickle")]
    checkpoint = tmp_path / "model.ckpt"
    checkpoint.write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(PickleRefused, match=r"model\.ckpt"):
        lock(checkpoint, cache=cache)


def test_a_broken_manifest_says_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text('[model]\nname = "x"\nsource = "."\nrevision = "r"\n[files]\n"a" = "zz"\n')
    with pytest.raises(ManifestError, match=r"'a' is not a sha256"):
        read_manifest(path)
    path.write_text("[model\n")
    with pytest.raises(ManifestError, match="not valid TOML"):
        read_manifest(path)


def _inhouse(*args: str, cache_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "INHOUSE_CACHE": str(cache_dir)}
    return subprocess.run(
        [*inhouse_command(), *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_cli_lock_verify_and_serve_refuses_a_tampered_file(tmp_path: Path, folder: Path) -> None:
    manifest = tmp_path / "team" / "inhouse.model.toml"
    manifest.parent.mkdir()
    cache_dir = tmp_path / "cache"
    locked = _inhouse("models", "lock", str(folder), "--out", str(manifest), cache_dir=cache_dir)
    assert locked.returncode == 0, locked.stderr
    assert read_manifest(manifest).source == str(folder)
    verified = _inhouse("models", "verify", str(manifest), cache_dir=cache_dir)
    assert verified.returncode == 0 and "ok: 3 files" in verified.stdout
    beside = tmp_path / "inhouse.model.toml"  # the model below the manifest: kept relative
    again = _inhouse("models", "lock", str(folder), "--out", str(beside), cache_dir=cache_dir)
    assert again.returncode == 0, again.stderr
    assert read_manifest(beside).source == "tiny-model"
    assert read_manifest(beside).source_path() == folder
    _flip_one_byte(folder / "model.safetensors")
    refused = _inhouse("models", "verify", str(manifest), cache_dir=cache_dir)
    assert refused.returncode == 1 and "model.safetensors: changed" in refused.stderr
    served = _inhouse("serve", "--manifest", str(manifest), "--port", "1", cache_dir=cache_dir)
    assert served.returncode == 1
    assert "model.safetensors: changed" in served.stderr
    assert "Serving on" not in served.stdout
    up = _inhouse("up", "--manifest", str(manifest), "--port", "1", cache_dir=cache_dir)
    assert up.returncode == 1 and "model.safetensors: changed" in up.stderr
    assert "replica" not in up.stdout  # nothing was started
