"""What a client did wrong, in our words, from the errors pydantic reports for a body.

Pydantic names each member it tried of a union field in the error's location
(``stop.constrained-str``, ``prompt.list[constrained-int].1``) and reports every member's
failure, first the one least likely meant (a 17-string ``stop`` list is first "not a
valid string"). :func:`describe` drops those names from the path, prefers the member
whose kind of value the client sent (the list that is too long), and phrases the
problem without pydantic's internals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# A value of the wrong JSON kind, and what the field wanted instead.
KIND_WANTED = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}
# A value of the right kind out of range: the phrase, filled from the error's ``ctx``.
OUT_OF_RANGE = {
    "too_long": "may hold at most {max_length} items, not {actual_length}",
    "too_short": "must hold at least {min_length} item(s)",
    "string_too_short": "must be at least {min_length} character(s) long",
    "string_too_long": "must be at most {max_length} characters long",
    "string_pattern_mismatch": "must match the pattern {pattern}",
    "greater_than_equal": "must be at least {ge}",
    "greater_than": "must be greater than {gt}",
    "less_than_equal": "must be at most {le}",
    "less_than": "must be less than {lt}",
    "finite_number": "must be a finite number",
    "literal_error": "must be {expected}",
    "enum": "must be {expected}",
    "union_tag_invalid": "has {discriminator} {tag!r}; it must be one of {expected_tags}",
    "union_tag_not_found": "needs a {discriminator}",
}
_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def describe(errors: Sequence[Mapping[str, Any]]) -> tuple[str, str | None]:
    """(message, param) for the first field pydantic refused; ``param`` is the top-level
    field. ``errors`` as ``ValidationError.errors()`` gives them, a leading ``body`` (as
    FastAPI adds) is dropped."""
    if not errors:
        return "The request is not valid.", None
    paths = [_path(e.get("loc", ())) for e in errors]
    field = paths[0][:1]
    same = [(p, e) for p, e in zip(paths, errors, strict=True) if p[:1] == field]
    in_range = [(p, e) for p, e in same if e.get("type") not in KIND_WANTED]
    # Out of range: the member whose kind was sent. Else the member that matched deepest.
    path, error = in_range[0] if in_range else max(same, key=lambda pe: len(pe[0]))
    kind = error.get("type", "")
    where = ".".join(path)
    param = path[0] if path else None
    if kind == "json_invalid":
        return "The request body is not valid JSON.", None
    if kind == "missing":
        if not where:
            return "The request needs a JSON body.", None
        return f"'{where}' is a required property.", param
    if in_range:
        phrase = _out_of_range(error)
    else:  # the wrong kind of value: each kind the members there take
        wanted = dict.fromkeys(KIND_WANTED[e["type"]] for p, e in same if p == path)
        phrase = "must be " + " or ".join(wanted)
    return (f"Invalid value for '{where}': {phrase}." if where else f"{phrase}."), param


def _out_of_range(error: Mapping[str, Any]) -> str:
    kind = error.get("type", "")
    ctx = error.get("ctx") or {}
    if kind in ("too_short", "string_too_short") and ctx.get("min_length") == 1:
        return "must not be empty"
    template = OUT_OF_RANGE.get(kind)
    if template is not None:
        try:
            return template.format(**ctx)
        except (KeyError, IndexError):
            pass
    message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    return message.rstrip(".")


def _path(loc: Sequence[Any]) -> list[str]:
    """The location without pydantic's union member names (and a discriminated union's
    tag, which follows its member name or, in a list, the item's index)."""
    parts = list(loc)
    if parts[:1] == ["body"]:
        parts = parts[1:]
    out: list[str] = []
    i = 0
    while i < len(parts):
        part = parts[i]
        if isinstance(part, str) and _is_member_name(part):
            if part.startswith("tagged-union["):
                i += 1  # the tag itself
            elif part.startswith("list[tagged-union["):
                out += [str(p) for p in parts[i + 1 : i + 2]]  # the index, then the tag
                i += 2
            i += 1
            continue
        out.append(str(part))
        i += 1
    return out


def _is_member_name(part: str) -> bool:
    """A union member's name (``constrained-str``, ``list[int]``, ``NamedToolChoice``) or
    a dict key's marker (``[key]``), never one of our snake_case field names."""
    return any(c in part for c in "[]-") or part[:1].isupper() or part in _TYPE_NAMES
