"""Shared helpers for gateway tests: a real SQLite file and a clock tests move by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from inhouse.gateway.db import open_database
from inhouse.gateway.keys import KeyStore


class ManualClock:
    """A clock that only moves when the test says so."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'gateway.db'}"


@pytest.fixture
def store(db_url: str, clock: ManualClock) -> KeyStore:
    return KeyStore(open_database(db_url), b"test-pepper", clock)
