"""Allow-lists of names: a key's models and adapters, a team's adapters. Stored as one
comma-separated text column (NULL: no limit, so rows from before a list existed allow
everything), read as a frozenset (None: no limit), given on the command line as `a,b`
(`all`: no limit)."""

from __future__ import annotations

Names = frozenset[str] | None
EVERYTHING = "all"


def allows(names: Names, name: str) -> bool:
    """Whether the list lets `name` through (no list lets everything through)."""
    return names is None or name in names


def encode(names: Names) -> str | None:
    """The column's value: names sorted and comma-joined, NULL for no limit."""
    return None if not names else ",".join(sorted(names))


def decode(text: str | None) -> Names:
    """The list a column holds."""
    return frozenset(text.split(",")) if text else None


def from_option(text: str | None) -> Names:
    """A command-line `a,b` (spaces around names ignored); empty or `all`: no limit."""
    if text is None or text.strip() == EVERYTHING:
        return None
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    return names or None


def shown(names: Names) -> str:
    """How a listing prints it."""
    return EVERYTHING if names is None else ",".join(sorted(names))
