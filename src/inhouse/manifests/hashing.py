"""sha256 of model files, with a cache keyed by path, size and mtime so an unchanged multi-GB
folder is hashed once; progress is reported in bytes as files are read."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

CHUNK_BYTES = 1 << 22
CACHE_FILE = "hashes.json"

Progress = Callable[[int], None]  # called with the bytes just read


def default_cache_dir() -> Path:
    """``$INHOUSE_CACHE``, else ``~/.cache/inhouse``."""
    return Path(os.environ.get("INHOUSE_CACHE") or Path.home() / ".cache" / "inhouse")


def file_sha256(path: Path, progress: Progress | None = None) -> str:
    """The sha256 hex digest of a file's bytes, read in 4 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
            if progress is not None:
                progress(len(chunk))
    return digest.hexdigest()


class HashCache:
    """Remembers each file's sha256 under its resolved path with the size and mtime it had.

    A file whose size or mtime (nanoseconds) changed is hashed again; the cache is a JSON
    file written after each new hash, so an interrupted run keeps what it finished.
    """

    def __init__(self, path: Path | None = None, trust: bool = True) -> None:
        self.path = path or default_cache_dir() / CACHE_FILE
        self.trust = trust  # False: hash every file again (a copy that kept size and mtime)
        self._entries: dict[str, dict[str, int | str]] = self._read()
        self.hashed: list[Path] = []  # files read in full by this object (not cache hits)

    def _read(self) -> dict[str, dict[str, int | str]]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def sha256(self, file: Path, progress: Progress | None = None) -> str:
        """The file's sha256: from the cache when size and mtime match, else read and stored."""
        key = str(file.resolve())
        stat = file.stat()
        entry = self._entries.get(key)
        if (
            self.trust
            and entry
            and entry.get("size") == stat.st_size
            and entry.get("mtime_ns") == stat.st_mtime_ns
        ):
            if progress is not None:
                progress(stat.st_size)
            return str(entry["sha256"])
        sha = file_sha256(file, progress)
        self.hashed.append(file)
        self._entries[key] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha}
        self._write()
        return sha

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self._entries, indent=0, sort_keys=True))
        tmp.replace(self.path)
