"""Values as a table's columns hold them on every database the gateway runs on: integers
clamped to 64 bits, floats finite, text that PostgreSQL and SQLite both take (NUL and lone
surrogates escaped, see `text_fields.storable`) cut to the column's length. The audit and the
shadow pairs write what clients and upstreams sent; one odd value must not fail its row, nor
the batch it is inserted with."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sqlalchemy import Boolean, Column, Float, Integer, Table

from inhouse.http.text_fields import storable

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

Cleaner = Callable[[Any], Any]


def column_cleaners(table: Table, names: tuple[str, ...]) -> dict[str, Cleaner]:
    """For each column of `names`, a function that makes any value fit it."""
    return {name: _cleaner(table.c[name]) for name in names}


def _cleaner(column: Column[Any]) -> Cleaner:
    """A function that makes any value fit `column` (its null, or zero, when it cannot).
    `type(v) is int` also turns away bools; the common case costs one check."""
    missing = None if column.nullable else 0
    if isinstance(column.type, Boolean):
        return (lambda v: None if v is None else bool(v)) if column.nullable else bool
    if isinstance(column.type, Integer):
        return lambda v: min(max(v, INT64_MIN), INT64_MAX) if type(v) is int else missing
    if isinstance(column.type, Float):
        return lambda v: float(v) if type(v) in (float, int) and math.isfinite(v) else missing
    length = getattr(column.type, "length", None)

    def text(value: Any) -> str | None:
        if value is None:
            return None
        value = storable(value if type(value) is str else str(value))
        return value if length is None else value[:length]

    return text
