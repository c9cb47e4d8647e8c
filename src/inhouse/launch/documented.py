"""Each engine's documented options, read from the lists kept in inhouse/launch/documented/."""

from __future__ import annotations

import re
from importlib.resources import files

_LINE = re.compile(r"^(-\S+)(?: \{(.*)\})?$")


def documented_options(filename: str) -> dict[str, frozenset[str] | None]:
    """Option → the values it accepts (None when any value goes), from one list file."""
    text = files("inhouse.launch").joinpath("documented", filename).read_text()
    options: dict[str, frozenset[str] | None] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None:
            raise ValueError(f"{filename}: not an option line: {line!r}")
        option, choices = match.groups()
        options[option] = frozenset(choices.split(",")) if choices else None
    return options


def undocumented(argv: list[str], filename: str) -> list[str]:
    """Options in `argv` the list does not have, and values outside an option's choices."""
    options = documented_options(filename)
    wrong = []
    for i, token in enumerate(argv):
        if not token.startswith("-"):
            continue
        if token not in options:
            wrong.append(token)
            continue
        choices = options[token]
        value = argv[i + 1] if i + 1 < len(argv) else None
        if choices is not None and value not in choices:
            wrong.append(f"{token} {value}")
    return wrong
