"""Graders: does an answer match what an item expects? Each is a pure function of the item
and the answer; :func:`check_expected` rejects an item whose ``expected`` the grader cannot use.

- ``exact``: the text, stripped of whitespace and a trailing period, equals ``expected``.
- ``contains``: ``expected`` (a string, or a list: all of them) appears, case-insensitively.
- ``regex``: the pattern ``expected`` matches somewhere (``re.search``).
- ``numeric``: the last number in the text is within ``tolerance`` of ``expected``.
- ``choice``: the first standalone capital letter A–D (or ``expected``'s own letters) is it.
- ``json_schema``: the text (or its first JSON block) parses and validates against ``expected``.
- ``tool_call``: the first tool call names ``expected["name"]``, its arguments are a JSON object
  that validates against that tool's ``parameters`` and holds ``expected["arguments"]``, if given.
- ``refusal``: the answer refuses (:func:`inhouse.eval.refusal.refused`) when ``expected`` is
  true, and does not when it is false.

:func:`schema_valid` and :func:`tool_call_valid` are the checks themselves, which the gateway
also makes of the answers of a model being released.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import jsonschema

from inhouse.eval.refusal import refused

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|-?\.\d+")
_FENCED = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


class Gradable(Protocol):
    """What a grader reads of an item (`items.EvalItem`, which checks its `expected` here)."""

    @property
    def grader(self) -> str: ...
    @property
    def expected(self) -> Any: ...
    @property
    def tolerance(self) -> float: ...
    @property
    def tools(self) -> list[dict[str, Any]] | None: ...


@dataclass(frozen=True, slots=True)
class Answer:
    """What an endpoint answered: the text and any tool calls (name, arguments JSON text)."""

    text: str
    tool_calls: tuple[tuple[str, str], ...] = field(default=())


def _exact(item: Gradable, answer: Answer) -> bool:
    return answer.text.strip().removesuffix(".").strip() == str(item.expected).strip()


def _contains(item: Gradable, answer: Answer) -> bool:
    wanted = item.expected if isinstance(item.expected, list) else [item.expected]
    text = answer.text.casefold()
    return all(str(w).casefold() in text for w in wanted)


def _regex(item: Gradable, answer: Answer) -> bool:
    return re.search(item.expected, answer.text) is not None


def last_number(text: str) -> float | None:
    """The last number written in ``text`` (thousands commas allowed), or None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def _numeric(item: Gradable, answer: Answer) -> bool:
    value = last_number(answer.text)
    return value is not None and math.isclose(
        value, float(item.expected), rel_tol=0.0, abs_tol=item.tolerance
    )


def chosen_letter(text: str, letters: str = "ABCD") -> str | None:
    """The first standalone option letter in ``text`` ("B", "(B)", "B)", "Answer: B")."""
    match = re.search(rf"(?<![A-Za-z])([{letters}])(?![A-Za-z])", text)
    return match.group(1) if match else None


def _choice(item: Gradable, answer: Answer) -> bool:
    letters = "".join(sorted(set("ABCD") | {str(item.expected)}))
    return chosen_letter(answer.text, letters) == item.expected


def json_in(text: str) -> Any:
    """The JSON value of ``text``: all of it, else a fenced block, else its outermost {…};
    raises ``ValueError`` when none parses."""
    candidates = [text.strip()]
    candidates += [m.strip() for m in _FENCED.findall(text)]
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    raise ValueError("no JSON in the answer")


def schema_valid(schema: Any, value: Any) -> bool:
    """Whether ``value`` validates against the JSON schema (Draft 2020-12). A schema the
    validator cannot use (malformed, an unknown type, a ``$ref`` it cannot resolve without
    fetching it) constrains nothing: True."""
    try:
        return jsonschema.Draft202012Validator(schema).is_valid(value)
    except Exception:  # any failure of the schema itself, not of the value
        return True


def _json_schema(item: Gradable, answer: Answer) -> bool:
    try:
        value = json_in(answer.text)
    except ValueError:
        return False
    return schema_valid(item.expected, value)


def tool_parameters(tools: list[dict[str, Any]] | None, name: str) -> dict[str, Any] | None:
    """The ``parameters`` schema of the function named ``name`` in ``tools`` (None if none is)."""
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name") == name:
            return function.get("parameters") or {"type": "object"}
    return None


def tool_arguments(tools: list[dict[str, Any]] | None, name: str, text: str) -> Any:
    """The call's arguments when it names one of ``tools`` and they are a JSON object valid
    for its ``parameters``; else None."""
    schema = tool_parameters(tools, name)
    if schema is None:
        return None
    try:
        arguments = json.loads(text)
    except ValueError:
        return None
    ok = isinstance(arguments, dict) and schema_valid(schema, arguments)
    return arguments if ok else None


def tool_call_valid(tools: list[dict[str, Any]] | None, name: str, text: str) -> bool:
    """Whether a tool call names one of ``tools`` with arguments valid for its parameters."""
    return tool_arguments(tools, name, text) is not None


def _tool_call(item: Gradable, answer: Answer) -> bool:
    if not answer.tool_calls:
        return False
    name, arguments_text = answer.tool_calls[0]
    if name != item.expected["name"]:
        return False
    arguments = tool_arguments(item.tools, name, arguments_text)
    if arguments is None:
        return False
    wanted = item.expected.get("arguments", {})
    return all(arguments.get(key) == value for key, value in wanted.items())


def _refusal(item: Gradable, answer: Answer) -> bool:
    return refused(answer.text) is item.expected


GRADERS: dict[str, Callable[[Gradable, Answer], bool]] = {
    "exact": _exact,
    "contains": _contains,
    "regex": _regex,
    "numeric": _numeric,
    "choice": _choice,
    "json_schema": _json_schema,
    "tool_call": _tool_call,
    "refusal": _refusal,
}


def grade(item: Gradable, answer: Answer) -> bool:
    """True when ``answer`` is right for ``item`` under the item's grader."""
    return GRADERS[item.grader](item, answer)


def _is_text(expected: Any) -> bool:
    if isinstance(expected, list):
        return bool(expected) and all(isinstance(e, str) and e for e in expected)
    return isinstance(expected, str) and bool(expected)


def check_expected(item: Gradable) -> None:
    """``ValueError`` when the item's ``expected`` does not fit its grader."""
    expected, grader = item.expected, item.grader
    if grader in ("exact", "contains") and not _is_text(expected):
        raise ValueError(f"{grader}: 'expected' must be a non-empty string")
    if grader == "regex":
        try:
            re.compile(expected)
        except (re.error, TypeError) as err:
            raise ValueError(f"regex: 'expected' is not a regular expression ({err})") from None
    if grader == "numeric" and (
        isinstance(expected, bool) or not isinstance(expected, int | float)
    ):
        raise ValueError("numeric: 'expected' must be a number")
    if grader == "choice" and not (
        isinstance(expected, str) and len(expected) == 1 and expected.isupper()
    ):
        raise ValueError("choice: 'expected' must be one capital letter such as 'B'")
    if grader == "json_schema":
        try:
            jsonschema.Draft202012Validator.check_schema(expected)
        except jsonschema.SchemaError as err:
            raise ValueError(
                f"json_schema: 'expected' is not a JSON schema ({err.message})"
            ) from None
    if grader == "refusal" and not isinstance(expected, bool):
        raise ValueError("refusal: 'expected' must be true (it should refuse) or false")
    if grader == "tool_call":
        if not isinstance(expected, dict) or not isinstance(expected.get("name"), str):
            raise ValueError('tool_call: \'expected\' must be {"name": ..., "arguments": {...}}')
        if tool_parameters(item.tools, expected["name"]) is None:
            raise ValueError(f"tool_call: 'tools' has no function named {expected['name']!r}")
