"""A request body as JSON that is safe to pass on: an object, not nested absurdly deep,
and with text that is valid Unicode (a lone surrogate such as ``"\\udfff"`` is legal
JSON but no tokenizer, encoder or database driver takes it)."""

from __future__ import annotations

import json
from typing import Any

from inhouse.api.bounds import MAX_JSON_DEPTH
from inhouse.api.errors import APIError, invalid_request


def json_object(raw: bytes) -> dict[str, Any]:
    """The body parsed as a JSON object, or a 400 saying what is wrong with it."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise too_deep() from None
    except ValueError:
        raise invalid_request("The request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise invalid_request("The request body must be a JSON object.")
    return body


def too_deep() -> APIError:
    """400: JSON nested deeper than we accept."""
    return invalid_request(f"The request body is nested deeper than {MAX_JSON_DEPTH} levels.")


def tree_problem(value: Any, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why a parsed JSON value cannot be served (too deep, or a string that is not
    valid Unicode, with where it is), or None. Walks without recursion."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, str):
            if not _valid_text(node):
                return f"{path or 'The body'} is not valid Unicode text (a lone surrogate)."
            continue
        if isinstance(node, dict):
            items = node.items()
        elif isinstance(node, list):
            items = enumerate(node)
        else:
            continue
        if depth > max_depth:
            return f"The request body is nested deeper than {max_depth} levels."
        for key, child in items:
            if isinstance(key, str) and not _valid_text(key):
                where = path or "the body"
                return f"A key in {where} is not valid Unicode text (a lone surrogate)."
            if isinstance(child, str | dict | list):
                stack.append((child, depth + 1, f"{path}.{key}" if path else str(key)))
    return None


def _valid_text(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
