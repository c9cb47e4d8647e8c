"""The audit journal: append-only segment files, one JSON line per audit row.

`AuditWriter.record` appends each row to the open segment with one `write(2)` before the
response leaves, so a killed gateway (SIGKILL, OOM) loses no row: the kernel holds what was
written. (A power loss can lose what the kernel had not flushed yet, as with the SQLite
database itself, which runs with `synchronous=NORMAL`.) The writer's flush closes the segment,
inserts its rows, then deletes the file. A process holds an exclusive `flock` on each
segment it owns, so a gateway starting beside a live one adopts only the segments of dead
processes; each segment's name is committed with its rows (`audit_segments`), so a segment
whose rows reached the database just before a crash is deleted, not inserted twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("inhouse.gateway.audit")

SUFFIX = ".jsonl"
REJECTED = "rejected.jsonl"


@dataclass(slots=True)
class Segment:
    """One journal file, locked by this process while it holds it."""

    path: Path
    fd: int
    rows: list[dict[str, Any]] | None = field(default_factory=list)
    count: int = 0

    @property
    def name(self) -> str:
        return self.path.stem

    def read_rows(self) -> list[dict[str, Any]]:
        """The rows kept in memory, or read back from the file (a torn last line is skipped)."""
        if self.rows is not None:
            return self.rows
        rows = []
        for line in self.path.read_bytes().splitlines():
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                if isinstance(row, dict):
                    rows.append(row)
        return rows

    def remove(self) -> None:
        """Delete the file, then drop the lock (once)."""
        if self.fd < 0:
            return
        self.path.unlink(missing_ok=True)
        os.close(self.fd)
        self.fd = -1


class Journal:
    """The segment being appended to, in a directory only this user can read."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.directory = directory
        self.current = self._new_segment()
        self._write_failed = False

    def append(self, row: dict[str, Any]) -> None:
        """Write one row as one line (one `write(2)`), and keep it in memory for the commit;
        if the disk refuses, the row is still committed from memory (logged once)."""
        segment = self.current
        try:
            os.write(segment.fd, json.dumps(row, separators=(",", ":")).encode() + b"\n")
        except OSError as exc:
            if not self._write_failed:
                log.error("audit: cannot write the journal (%s); rows are kept in memory", exc)
                self._write_failed = True
        segment.count += 1
        if segment.rows is not None:
            segment.rows.append(row)

    def rotate(self) -> Segment | None:
        """Close the current segment for commit and open a new one; None if it is empty."""
        if not self.current.count:
            return None
        closed, self.current = self.current, self._new_segment()
        return closed

    def orphans(self) -> Iterator[Segment]:
        """Segments left by processes that died (no other process holds their lock)."""
        for path in sorted(self.directory.glob(f"*{SUFFIX}")):
            if path.name == REJECTED or path == self.current.path:
                continue
            segment = _lock(path, create=False)
            if segment is not None:
                segment.rows = None
                yield segment

    def set_aside(self, row: dict[str, Any]) -> None:
        """Keep a row the database refused in `rejected.jsonl`, for a person to look at."""
        fd = os.open(self.directory / REJECTED, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, json.dumps(row, separators=(",", ":"), default=repr).encode() + b"\n")
        finally:
            os.close(fd)

    def close(self) -> None:
        """Drop the open segment if nothing was written to it."""
        if not self.current.count:
            self.current.remove()

    def _new_segment(self) -> Segment:
        # Another gateway's `orphans` may lock a file in the instant between its creation
        # and our lock (it then commits it empty and deletes it): take a new name.
        for _ in range(100):
            segment = _lock(self.directory / f"{uuid.uuid4().hex}{SUFFIX}", create=True)
            if segment is not None:
                return segment
        raise OSError(f"could not lock a new audit journal segment in {self.directory}")


def _lock(path: Path, create: bool) -> Segment | None:
    """Open and lock a segment; None if another process holds it or it is gone."""
    flags = os.O_WRONLY | os.O_APPEND | (os.O_CREAT | os.O_EXCL if create else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    if not create and not path.exists():  # committed and deleted while we waited
        os.close(fd)
        return None
    return Segment(path, fd)
