"""The checks the gateway makes of each answer of a model with releases (`answer_checks`):
pure functions of the request body and the answer, with `inhouse eval`'s own checks."""

from __future__ import annotations

from typing import Any

import pytest

from inhouse.gateway.releases.answer_checks import AnswerChecks, Expectations, check_answer

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
JSON_BODY = {
    "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}
}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": SCHEMA}}]


@pytest.mark.parametrize(
    ("body", "text", "calls", "expected"),
    [
        ({}, "Hi!", [], AnswerChecks(None, None, False)),
        ({}, "I cannot help with that.", [], AnswerChecks(None, None, True)),
        (JSON_BODY, '{"n": 3}', [], AnswerChecks(True, None, False)),
        (JSON_BODY, '{"n": "3"}', [], AnswerChecks(False, None, False)),  # not the schema's
        (JSON_BODY, '```json\n{"n": 3}\n```', [], AnswerChecks(False, None, False)),  # not JSON
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "[1]", [],
         AnswerChecks(True, None, False)),  # no schema: any JSON
        ({"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"$ref": "https://example.com/s.json"}}}}, "{}", [],
         AnswerChecks(True, None, False)),  # a schema it cannot resolve offline constrains nothing
        ({"tools": TOOLS}, "", [("add", '{"n": 1}')], AnswerChecks(None, True, False)),
        ({"tools": TOOLS}, "", [("add", '{"n": 1}'), ("add", '{"n": 1.5}')],
         AnswerChecks(None, False, False)),  # one call of two fails its parameters
        ({"tools": TOOLS}, "", [("sub", '{"n": 1}')], AnswerChecks(None, False, False)),
        ({"tools": TOOLS}, "", [("add", '{"n": 1')], AnswerChecks(None, False, False)),
        ({"tools": TOOLS}, "", [("add", "[1]")], AnswerChecks(None, False, False)),
        ({"tools": TOOLS}, "No tool needed.", [], AnswerChecks(None, None, False)),
    ],
)  # fmt: skip
def test_answer_checks(
    body: dict[str, Any], text: str, calls: list[tuple[str, str]], expected: AnswerChecks
) -> None:
    assert check_answer(Expectations.of(body), text, calls) == expected
