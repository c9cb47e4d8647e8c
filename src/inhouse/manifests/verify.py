"""Lock a model's files (and its LoRA adapters') into a manifest, and verify a model and its
adapters against its manifest."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from pathlib import Path

from inhouse.manifests.hashing import HashCache, Progress
from inhouse.manifests.manifest import Manifest, ManifestError
from inhouse.manifests.pickles import WHY, pickle_files, refuse_pickle

# The files a loader reads from an HF folder: weights, config, tokenizer, chat template.
TRACKED_SUFFIXES = frozenset({".safetensors", ".gguf", ".json", ".model", ".txt", ".jinja"})
ADAPTER_CONFIG = "adapter_config.json"  # what makes a folder a PEFT adapter
_SNAPSHOT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True, slots=True)
class Problem:
    """One file that keeps a model from matching its manifest."""

    file: str
    kind: str  # changed, missing, unexpected or pickle
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.file}: {self.kind}" + (f" ({self.detail})" if self.detail else "")


def model_files(source: Path) -> dict[str, Path]:
    """The files a manifest pins: the .gguf itself, or a folder's tracked top-level files."""
    if source.is_file():
        return {source.name: source}
    if not source.is_dir():
        raise ManifestError(f"model source {source} does not exist")
    return {
        p.name: p
        for p in sorted(source.iterdir())
        if p.is_file() and p.suffix.lower() in TRACKED_SUFFIXES
    }


def total_bytes(source: Path) -> int:
    """Bytes a lock or verify of ``source`` reads (for a progress bar's total)."""
    return sum(p.stat().st_size for p in model_files(source).values())


def lock(
    source: Path,
    name: str | None = None,
    revision: str | None = None,
    dtype: str = "auto",
    quantization: str = "auto",
    cache: HashCache | None = None,
    progress: Progress | None = None,
) -> Manifest:
    """A manifest of ``source`` (a .gguf file or an HF folder) with every file's sha256."""
    refuse_pickle(source)
    files = model_files(source)
    if not any(p.suffix in (".safetensors", ".gguf") for p in files.values()):
        raise ManifestError(f"{source} has no .safetensors or .gguf weights to lock")
    cache = cache or HashCache()
    hashes = {file: cache.sha256(path, progress) for file, path in files.items()}
    return Manifest(
        name=name or (source.stem if source.is_file() else source.name),
        source=str(source),
        revision=revision or _revision(source, hashes),
        files=hashes,
        dtype=dtype,
        quantization=quantization,
    )


def _revision(source: Path, hashes: dict[str, str]) -> str:
    """The HF cache's snapshot commit when the folder is one, else a digest of the files."""
    folder = source.parent if source.is_file() else source
    if folder.parent.name == "snapshots" and _SNAPSHOT.match(folder.name):
        return folder.name
    listing = "".join(f"{sha}  {file}\n" for file, sha in sorted(hashes.items()))
    return "sha256:" + hashlib.sha256(listing.encode()).hexdigest()[:16]


def verify(
    manifest: Manifest, cache: HashCache | None = None, progress: Progress | None = None
) -> list[Problem]:
    """Each file that is missing, changed, unexpected or pickle-based; empty when it matches."""
    source = manifest.source_path()
    if not source.exists():
        return [Problem(str(source), "missing", "the manifest's source does not exist")]
    cache = cache or HashCache()
    present = model_files(source)
    problems = [Problem(p.name, "pickle", WHY.format(names=p.name)) for p in pickle_files(source)]
    for file, expected in sorted(manifest.files.items()):
        path = present.get(file)
        if path is None:
            problems.append(Problem(file, "missing"))
            continue
        actual = cache.sha256(path, progress)
        if actual != expected:
            problems.append(
                Problem(file, "changed", f"sha256 {actual[:12]}…, pinned {expected[:12]}…")
            )
    problems += [
        Problem(file, "unexpected", "not in the manifest")
        for file in sorted(present.keys() - manifest.files.keys())
    ]
    for adapter in manifest.adapters:  # each named by its folder's name: "support/…"
        found = verify(adapter, cache, progress)
        problems += [replace(p, file=f"{adapter.name}/{p.file}") for p in found]
    return problems


def lock_adapter(
    name: str, source: Path, cache: HashCache | None = None, progress: Progress | None = None
) -> Manifest:
    """A LoRA adapter's pins (`Manifest.adapters`): its PEFT folder's files, as `lock`."""
    if not (source / ADAPTER_CONFIG).is_file():
        raise ManifestError(f"adapter {name!r}: {source} has no {ADAPTER_CONFIG} (not PEFT's)")
    return lock(source, name, cache=cache, progress=progress)


def require_verified(
    manifest: Manifest, cache: HashCache | None = None, progress: Progress | None = None
) -> None:
    """Raise :class:`ManifestError` naming every file that does not match the manifest."""
    problems = verify(manifest, cache, progress)
    if problems:
        listed = "; ".join(str(p) for p in problems)
        where = manifest.path or manifest.source
        raise ManifestError(f"{manifest.source_path()} does not match manifest {where}: {listed}")
