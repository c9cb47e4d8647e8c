"""What the gateway checks of each answer of a model with releases, for the guardrails and
`inhouse release compare`: whether a `json_schema` answer is JSON valid for its schema,
whether the answer's tool calls each name one of the request's tools with arguments valid
for its parameters, and whether it is a refusal. The checks are `inhouse eval`'s own
(`schema_valid`, `tool_call_valid`, `refused`); only their bits are stored, so a key that
does not log content keeps them too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from inhouse.eval.graders import schema_valid, tool_call_valid
from inhouse.eval.refusal import refused


@dataclass(frozen=True, slots=True)
class Expectations:
    """What the request asked for that its answer is checked against."""

    wants_json: bool  # response_format json_schema
    schema: Any  # its schema ({} when it gives none)
    tools: list[dict[str, Any]] | None

    @classmethod
    def of(cls, body: dict[str, Any]) -> Expectations:
        """Read from the request body (already checked by the gateway's request models)."""
        response_format = body.get("response_format")
        wants_json = isinstance(response_format, dict) and (
            response_format.get("type") == "json_schema"
        )
        schema: Any = {}
        if wants_json:
            spec = response_format.get("json_schema")
            schema = spec.get("schema", {}) if isinstance(spec, dict) else {}
        tools = body.get("tools")
        return cls(wants_json, schema, tools if isinstance(tools, list) and tools else None)


@dataclass(frozen=True, slots=True)
class AnswerChecks:
    """The bits of one answer; None where a check does not apply."""

    json_valid: bool | None = None  # json_schema requests
    tool_calls_valid: bool | None = None  # requests with tools whose answer called one
    refusal: bool | None = None  # every answer checked


NOT_CHECKED = AnswerChecks()


def check_answer(expects: Expectations, text: str, calls: list[tuple[str, str]]) -> AnswerChecks:
    """The checks of an answer (`text` and its tool calls, name and arguments JSON)."""
    json_valid = None
    if expects.wants_json:
        try:
            json_valid = schema_valid(expects.schema, json.loads(text))
        except ValueError:
            json_valid = False
    tools_valid = None
    if expects.tools is not None and calls:
        tools_valid = all(tool_call_valid(expects.tools, n, a) for n, a in calls)
    return AnswerChecks(json_valid, tools_valid, refused(text))
