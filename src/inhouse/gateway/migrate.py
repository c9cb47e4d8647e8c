"""Bring an existing gateway database up to the current schema: the columns and indexes
added since it was created. `create_all` makes only missing tables, so without this a
database from an older release would refuse every query that names a new column."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Engine, MetaData, inspect, text
from sqlalchemy.exc import OperationalError, ProgrammingError
from sqlalchemy.schema import CreateIndex


def add_missing(db: Engine, metadata: MetaData) -> None:
    """Add every nullable column and every index of `metadata` that the database lacks.

    Replicas starting together may race to add the same one: a loser's error is ignored
    when a fresh look finds the column or index there."""
    for table in metadata.sorted_tables:
        for column in table.columns:
            if column.name in _columns(db, table.name):
                continue
            if not column.nullable:
                raise RuntimeError(f"{table.name}.{column.name} must be nullable to be added")
            kind = column.type.compile(db.dialect)
            ddl = f'ALTER TABLE {table.name} ADD COLUMN "{column.name}" {kind}'
            _run(db, ddl, lambda t=table.name, c=column.name: c in _columns(db, t))
        for index in table.indexes:
            if index.name not in _indexes(db, table.name):
                ddl = str(CreateIndex(index).compile(dialect=db.dialect))
                _run(db, ddl, lambda t=table.name, n=index.name: n in _indexes(db, t))


def _columns(db: Engine, table: str) -> set[str]:
    return {c["name"] for c in inspect(db).get_columns(table)}


def _indexes(db: Engine, table: str) -> set[str | None]:
    return {i["name"] for i in inspect(db).get_indexes(table)}


def _run(db: Engine, ddl: str, done_elsewhere: Callable[[], bool]) -> None:
    try:
        with db.begin() as conn:
            conn.execute(text(ddl))
    except (OperationalError, ProgrammingError):
        if not done_elsewhere():
            raise
