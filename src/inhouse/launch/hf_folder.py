"""A GGUF file as the HF safetensors folder an engine that reads no GGUF needs.

Written once per GGUF (its sha256 names the folder, under ~/.cache/inhouse/hf-bf16/), its
weights dequantized to bfloat16, with tokenizer and chat template from the GGUF. A
manifest beside it pins every file it wrote, with the GGUF's sha256 as its revision; each
later use verifies the folder against it (hashes are cached by size and mtime, so that is
cheap) and writes it again if it does not match.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from inhouse.manifests.hashing import CACHE_FILE, HashCache, default_cache_dir
from inhouse.manifests.manifest import Manifest, ManifestError, read_manifest
from inhouse.manifests.verify import lock, verify

FOLDERS = "hf-bf16"
MANIFEST_SUFFIX = ".model.toml"


def safetensors_folder(gguf: Path, cache_dir: Path | None = None) -> Path:
    """The bfloat16 HF folder of `gguf`, written now if it is missing or does not match its
    manifest."""
    cache = HashCache((cache_dir or default_cache_dir()) / CACHE_FILE)
    sha = cache.sha256(gguf)
    root = (cache_dir or default_cache_dir()) / FOLDERS
    folder, manifest_path = root / sha, root / f"{sha}{MANIFEST_SUFFIX}"
    if _matches(manifest_path, sha, cache):
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    _convert(gguf, folder)
    pinned = lock(folder, name=gguf.stem, revision=sha, dtype="bfloat16", cache=cache)
    manifest_path.write_text(pinned.to_toml())
    return folder


def _matches(manifest_path: Path, sha: str, cache: HashCache) -> bool:
    """Whether a folder written earlier is there, pinned to this GGUF, and unchanged."""
    try:
        manifest: Manifest = read_manifest(manifest_path)
    except ManifestError:
        return False
    return manifest.revision == sha and not verify(manifest, cache)


def _convert(gguf: Path, folder: Path) -> None:
    # torch, gguf and transformers load only when a folder is written.
    import torch

    from inhouse.engine.models.gguf_convert import convert_gguf

    convert_gguf(gguf, folder, dtype=torch.bfloat16)
