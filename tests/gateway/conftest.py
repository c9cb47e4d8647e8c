"""Shared helpers for gateway tests: a real SQLite file, a clock tests move by hand, the
release tests' two canned upstreams (see `release_env`), a PostgreSQL server per module that
asks for one, and one `inhouse serve` of the bundled model for the whole session."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from canned_upstream import Canned, canned_upstream
from release_env import CANDIDATE, STABLE

from inhouse.gateway.db_open import open_database
from inhouse.gateway.keys import KeyStore
from serving import Served, start_serve


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


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    """A real PostgreSQL server (pgserver) for one module; the SQLAlchemy URL of its
    `postgres` database. Its data lives right under the system temp dir: run as root,
    pgserver runs PostgreSQL as its own user, who cannot enter pytest's private temp dirs."""
    pgserver = pytest.importorskip("pgserver", reason="pip install -e '.[dev]' (pgserver)")
    with tempfile.TemporaryDirectory(prefix="inhouse-pgdata-") as data:
        server = pgserver.get_server(data, cleanup_mode="stop")
        try:
            yield server.get_uri().replace("postgresql://", "postgresql+psycopg://", 1)
        finally:
            server.cleanup()


@pytest.fixture(scope="session")
def bundled_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One `inhouse serve` of the bundled model (`SERVE_OPTIONS`, key `SERVE_KEY`) shared by
    the modules that only send it short requests: none of them stops, restarts or
    reconfigures it, and what they read back (audit rows, keys, limits) lives in each
    module's own gateway database, so loading the model once spares each module its
    start-up. (The degrade scenario keeps its own: its long held streams would still be
    generating, taking CPU from the next module.)"""
    served = start_serve(tmp_path_factory.mktemp("bundled-serve") / "serve.log")
    try:
        yield served
    finally:
        served.stop()
