"""The gateway's SQLite file shared by processes: a second open in one process must not
cost the first one's commits."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from sqlalchemy import insert

from inhouse.gateway.db import audit_segments
from inhouse.gateway.db_open import open_database


def _touch_from_another_process(db_file: Path) -> None:
    """Open, read and close the file elsewhere, as `inhouse keys` does beside a gateway. A
    closing SQLite connection that finds no other holder checkpoints and deletes the WAL."""
    script = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]);"
        " c.execute('select 1 from audit_segments').fetchall(); c.close()"
    )
    subprocess.run([sys.executable, "-c", script, str(db_file)], check=True, timeout=60)


def test_reopening_the_database_keeps_this_process_commits(tmp_path: Path) -> None:
    db_file = tmp_path / "gateway.db"
    first = open_database(f"sqlite:///{db_file}")
    with first.begin() as conn:
        conn.execute(insert(audit_segments), {"name": "before"})
    open_database(f"sqlite:///{db_file}").dispose()  # as `inhouse up` does after its admin key
    _touch_from_another_process(db_file)
    with first.begin() as conn:
        conn.execute(insert(audit_segments), {"name": "after"})
    _touch_from_another_process(db_file)

    names = sqlite3.connect(db_file).execute("select name from audit_segments").fetchall()
    assert sorted(n for (n,) in names) == ["after", "before"]
    first.dispose()
    names = sqlite3.connect(db_file).execute("select name from audit_segments").fetchall()
    assert sorted(n for (n,) in names) == ["after", "before"]


def test_a_new_database_file_is_private(tmp_path: Path) -> None:
    db_file = tmp_path / "sub" / "gateway.db"
    open_database(f"sqlite:///{db_file}").dispose()
    assert db_file.stat().st_mode & 0o777 == 0o600
