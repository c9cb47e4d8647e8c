"""Usage report timing: a 30-day per-person (and per-team, per-day) report over N audit rows
on SQLite and on PostgreSQL (pgserver), through `inhouse.gateway.usage.report.usage`.

Method: a fresh database per engine, created by `open_database` (so with the schema's
indexes); N rows spread uniformly over the last 30 days across 500 people, 25 teams and
3 models (SQLite: executemany in one transaction; PostgreSQL: COPY); the hourly rollup
summed from them as an upgraded database's first open does (`rollup.backfill`, timed);
ANALYZE; one warm-up report, then the median and max of 5 timed reports per grouping, and
the same report by person from the audit rows alone (no rollup) for comparison. The target
is <= 1 s.

    .venv/bin/python benchmarks/usage_report.py [--rows 1000000] [--engines sqlite,postgres]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from sqlalchemy import Engine, text

from inhouse.gateway.db import schema_marks
from inhouse.gateway.db_open import open_database
from inhouse.gateway.usage import report as usage
from inhouse.gateway.usage import rollup

DAYS = 30
COLUMNS = ("ts", "key_name", "team", "model", "endpoint", "status", "stream", "prompt_tokens",
           "completion_tokens", "reserved_tokens", "fallback_used", "finish_reason")  # fmt: skip


def rows(n: int, now: float, seed: int = 0) -> list[tuple]:
    """`n` audit rows over the last DAYS days; 2 % errors."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        person = rng.randrange(500)
        status = 200 if rng.random() > 0.02 else 429
        out.append((
            now - rng.random() * DAYS * 86400, f"user-{person}", f"team-{person % 25}",
            ("smol", "qwen", "embed")[person % 3], "chat/completions", status, False,
            rng.randrange(50, 2000), rng.randrange(1, 500), 2500, False, "stop",
        ))  # fmt: skip
    return out


def load_sqlite(db: Engine, data: list[tuple]) -> None:
    raw = db.raw_connection()
    try:
        marks = ", ".join("?" for _ in COLUMNS)
        raw.cursor().executemany(
            f"INSERT INTO audit_log ({', '.join(COLUMNS)}) VALUES ({marks})", data
        )
        raw.commit()
        raw.cursor().execute("ANALYZE")
        raw.commit()
    finally:
        raw.close()


def load_postgres(db: Engine, data: list[tuple]) -> None:
    raw = db.raw_connection()
    try:
        cursor = raw.cursor()
        with cursor.copy(f"COPY audit_log ({', '.join(COLUMNS)}) FROM STDIN") as copy:
            for row in data:
                copy.write_row(row)
        raw.commit()
    finally:
        raw.close()
    with db.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE audit_log"))


def time_reports(db: Engine, now: float) -> dict[str, tuple[float, float, int]]:
    """(median s, max s, groups) of 5 reports per grouping, after one warm-up."""
    out = {}
    for by in ("person", "team", "day", "rows"):
        since = now - DAYS * 86400
        report = usage.usage if by != "rows" else _rows_only
        found = report(db, "person" if by == "rows" else by, since)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            found = report(db, "person" if by == "rows" else by, since)
            times.append(time.perf_counter() - start)
        out[by] = (statistics.median(times), max(times), len(found))
    return out


def _rows_only(db: Engine, by: str, since: float) -> list:
    """The report from the audit rows alone, as without the rollup."""
    return usage._from_audit(db, by, since, time.time())


def sum_rollup(db: Engine) -> None:
    """Sum the loaded rows into the rollup as the first open of an upgraded database does."""
    with db.begin() as conn:
        conn.execute(schema_marks.delete().where(schema_marks.c.name == rollup.BACKFILLED))
    rollup.backfill(db)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--engines", default="sqlite,postgres")
    args = parser.parse_args()
    now = time.time()
    data = rows(args.rows, now)
    with tempfile.TemporaryDirectory() as tmp:
        for engine in args.engines.split(","):
            server = None
            if engine == "sqlite":
                db = open_database(f"sqlite:///{Path(tmp) / 'usage.db'}")
                load = load_sqlite
            else:
                import pgserver

                server = pgserver.get_server(Path(tmp) / "pg", cleanup_mode="stop")
                url = server.get_uri().replace("postgresql://", "postgresql+psycopg://", 1)
                db = open_database(url)
                load = load_postgres
            start = time.perf_counter()
            load(db, data)
            loaded = time.perf_counter() - start
            start = time.perf_counter()
            sum_rollup(db)
            summed = time.perf_counter() - start
            print(f"{engine}: {args.rows} rows loaded in {loaded:.1f} s,"
                  f" rollup summed in {summed:.1f} s")  # fmt: skip
            for by, (median, worst, groups) in time_reports(db, now).items():
                label = "person, rows only" if by == "rows" else by
                print(f"  30-day report by {label:<17} {groups:>4} groups: "
                      f"median {median * 1000:.0f} ms, max {worst * 1000:.0f} ms")  # fmt: skip
            db.dispose()
            if server is not None:
                server.cleanup()


if __name__ == "__main__":
    main()
