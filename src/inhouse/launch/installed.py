"""Where an engine that `make` installs lives, and how its program is found."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from inhouse.launch.base import EngineMissing


def engine_cache(name: str) -> Path:
    """Where a `make` target installs an engine: `$XDG_CACHE_HOME/inhouse/<name>`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inhouse" / name


def find_program(variable: str, installed: Path, name: str) -> Path | None:
    """The file `$variable` names (None if it names none), else `installed` if it is there,
    else `name` on PATH."""
    explicit = os.environ.get(variable)
    if explicit:
        return Path(explicit) if Path(explicit).is_file() else None
    if installed.is_file():
        return installed
    found = shutil.which(name)
    return Path(found) if found else None


def require(program: Path | None, how_to_install: str) -> Path:
    """`program`, or EngineMissing saying `how_to_install` when it was not found."""
    if program is None:
        raise EngineMissing(how_to_install)
    return program
