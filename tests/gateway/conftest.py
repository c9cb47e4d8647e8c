"""Shared helpers for gateway tests: a real SQLite file, a clock tests move by hand, and the
release tests' two canned upstreams (see `release_env`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from canned_upstream import Canned, canned_upstream
from release_env import CANDIDATE, STABLE

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


@pytest.fixture(scope="module")
def canned() -> Iterator[Canned]:
    """One canned upstream per test module."""
    with canned_upstream() as upstream:
        yield upstream


@pytest.fixture(scope="module")
def upstreams() -> Iterator[tuple[Canned, Canned]]:
    with canned_upstream() as stable, canned_upstream() as candidate:
        yield stable, candidate


@pytest.fixture
def pair(upstreams: tuple[Canned, Canned]) -> tuple[Canned, Canned]:
    """The stable and the candidate upstream, answering as they do by default."""
    stable, candidate = upstreams
    stable.reset(STABLE)
    candidate.reset(CANDIDATE)
    return stable, candidate
