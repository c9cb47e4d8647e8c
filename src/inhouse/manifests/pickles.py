"""Refuse pickle-based weight files: loading one runs whatever code its author put in it."""

from __future__ import annotations

from pathlib import Path

PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle"})
WHY = (
    "pickle-based weights ({names}) are refused: unpickling runs arbitrary code from the "
    "file; convert them to safetensors (or use a GGUF) and load that instead"
)


class PickleRefused(ValueError):
    """A model source holds pickle-based weight files."""


def pickle_files(source: Path) -> list[Path]:
    """The pickle-based files of a model file or folder (top level, as loaders read them)."""
    if source.is_file():
        return [source] if source.suffix.lower() in PICKLE_SUFFIXES else []
    if source.is_dir():
        return sorted(
            p for p in source.iterdir() if p.is_file() and p.suffix.lower() in PICKLE_SUFFIXES
        )
    return []


def refuse_pickle(source: Path) -> None:
    """Raise :class:`PickleRefused`, naming the files, if ``source`` holds any pickle files."""
    found = pickle_files(source)
    if found:
        raise PickleRefused(WHY.format(names=", ".join(p.name for p in found)))
