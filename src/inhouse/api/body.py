"""A request body as JSON that is safe to pass on: an object, not nested absurdly deep,
and with text that is valid Unicode (a lone surrogate such as ``"\\udfff"`` is legal
JSON but no tokenizer, encoder or database driver takes it)."""

from __future__ import annotations

import json
from typing import Any

from inhouse.api.bounds import MAX_JSON_DEPTH
from inhouse.api.errors import APIError, invalid_request

NOT_AN_OBJECT = "The request body must be a JSON object."


def json_object(raw: bytes) -> dict[str, Any]:
    """The body parsed as a JSON object, or a 400 saying what is wrong with it."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise too_deep() from None
    except ValueError:
        raise invalid_request("The request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise invalid_request(NOT_AN_OBJECT)
    return body


def too_deep() -> APIError:
    """400: JSON nested deeper than we accept."""
    return invalid_request(f"The request body is nested deeper than {MAX_JSON_DEPTH} levels.")


def tree_problem(value: Any, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why a parsed JSON value cannot be served (too deep, or a string that is not
    valid Unicode, with where it is), or None; a scalar has no such problem. Walks level
    by level, without recursion."""
    level, depth = ([value] if isinstance(value, dict | list) else []), 0
    while level:
        depth += 1
        below: list[Any] = []
        for node in level:
            if node.__class__ is dict:
                for key in node:
                    if not _valid_text(key):
                        return f"A key in {_path_to(value, node)} is not valid Unicode text."
                children = node.values()
            else:
                children = node
            for child in children:
                kind = child.__class__
                if kind is str:
                    if not _valid_text(child):
                        where = _path_to(value, child)
                        return f"{where} is not valid Unicode text (a lone surrogate)."
                elif kind is dict or kind is list:
                    below.append(child)
        if below and depth >= max_depth:
            return f"The request body is nested deeper than {max_depth} levels."
        level = below
    return None


def _path_to(root: Any, target: Any) -> str:
    """Where ``target`` (by identity) sits in ``root``, as ``messages.0.content``."""
    stack: list[tuple[Any, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if node is target:
            return path or "the body"
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            if child is target or isinstance(child, dict | list):
                stack.append((child, f"{path}.{key}" if path else str(key)))
    return "the body"


def _valid_text(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
