"""Opening the gateway's database: the connection pool (SQLite with WAL by default, any
SQLAlchemy URL), its tables and the columns added since (`db`), and the daily usage sums of
the audit rows already there (`usage.rollup`)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, ProgrammingError

from inhouse.gateway.db import add_missing, metadata, sqlite_path
from inhouse.gateway.usage.rollup import backfill


def open_database(url: str) -> Engine:
    """Create the connection pool and tables; SQLite files get WAL and a busy timeout, and a new
    file is created readable by its owner only (SQLite gives its -wal/-shm the same mode)."""
    parsed = make_url(url)
    is_sqlite = parsed.get_backend_name() == "sqlite"
    path = sqlite_path(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        _create_private(path)
    db = create_engine(url, connect_args={"timeout": 30} if is_sqlite else {})
    if is_sqlite:
        event.listen(db, "connect", _sqlite_pragmas)
    _create_tables(db)
    add_missing(db, metadata)
    backfill(db)
    return db


def _create_private(path: Path) -> None:
    """Create the file, readable by its owner only, unless it exists. An existing file is
    never opened here: closing any descriptor of a file drops every POSIX lock this process
    holds on it, so another process would take this process's SQLite connections for gone,
    checkpoint and delete the WAL they are still writing to, and their commits would be lost."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _create_tables(db: Engine, attempts: int = 3) -> None:
    """Create the missing tables. `create_all` checks, then creates: replicas starting together
    on an empty PostgreSQL race, and each loser finds the tables when it tries again."""
    for attempt in range(attempts):
        try:
            metadata.create_all(db)
            return
        except (IntegrityError, ProgrammingError):
            if attempt == attempts - 1:
                raise


def _sqlite_pragmas(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
