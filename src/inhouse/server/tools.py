"""Tool calling for models whose chat template has no tools: the Hermes convention.

Tool definitions go into the system prompt; the model answers with
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, which
:func:`parse_tool_calls` turns back into OpenAI ``tool_calls``. Results come back as
``<tool_response>`` blocks in a user turn. ``tool_choice`` "required" and named
functions are enforced by a JSON schema (:func:`forced_tool_schema`).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from inhouse.api.chat import NamedToolChoice, ToolDefinition

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
_TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

TOOLS_SYSTEM_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments \
within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""

ANY_ARGUMENTS: dict[str, Any] = {"type": "object"}
# Most calls one forced ("required") answer may hold, so a repeating model still stops.
MAX_PARALLEL_TOOL_CALLS = 8


def tools_system_prompt(tools: list[ToolDefinition]) -> str:
    """The system-prompt section that describes ``tools`` to a model without tool templates."""
    lines = "\n".join(json.dumps(t.model_dump(exclude_none=True)) for t in tools)
    return TOOLS_SYSTEM_PROMPT.format(tools=lines)


def tool_call_text(name: str, arguments: str) -> str:
    """An earlier assistant tool call, written back in the convention the model was told."""
    try:
        args: Any = json.loads(arguments)
    except ValueError:
        args = arguments
    return f"{TOOL_CALL_OPEN}\n{json.dumps({'name': name, 'arguments': args})}\n{TOOL_CALL_CLOSE}"


def tool_response_text(content: str) -> str:
    """A tool result, wrapped for the model."""
    return f"<tool_response>\n{content}\n</tool_response>"


def new_tool_call_id() -> str:
    """An id in OpenAI's style."""
    return f"call_{uuid.uuid4().hex[:24]}"


def _parameters(tool: ToolDefinition) -> dict[str, Any]:
    return tool.function.parameters or ANY_ARGUMENTS


def forced_tool_schema(
    tools: list[ToolDefinition], choice: NamedToolChoice | str, parallel: bool
) -> dict[str, Any]:
    """The JSON schema the output must follow when a tool call is forced.

    A named function: the output is its arguments object. "required": an array of 1 to
    ``MAX_PARALLEL_TOOL_CALLS`` (1 without parallel calls) ``{"name", "arguments"}``
    objects, each naming an offered function.
    """
    if isinstance(choice, NamedToolChoice):
        tool = next(t for t in tools if t.function.name == choice.function.name)
        return _parameters(tool)
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": t.function.name}, "arguments": _parameters(t)},
            "required": ["name", "arguments"],
        }
        for t in tools
    ]
    return {
        "type": "array",
        "items": {"anyOf": calls},
        "minItems": 1,
        "maxItems": MAX_PARALLEL_TOOL_CALLS if parallel else 1,
    }


@dataclass(slots=True)
class ParsedCall:
    """A tool call read from model output: the function name and its arguments as JSON text."""

    name: str
    arguments: str


def calls_from_forced_output(text: str, choice: NamedToolChoice | str) -> list[ParsedCall]:
    """The calls of a constrained ("required" or named) output."""
    if isinstance(choice, NamedToolChoice):
        return [ParsedCall(choice.function.name, text)]
    return [
        ParsedCall(call["name"], json.dumps(call["arguments"], separators=(",", ":")))
        for call in json.loads(text)
    ]


def parse_tool_calls(text: str, known: set[str]) -> tuple[str | None, list[ParsedCall]]:
    """Split free model output into content and ``<tool_call>`` blocks naming known functions.

    Blocks that are not JSON objects with a known ``name`` stay in the content.
    """
    calls: list[ParsedCall] = []
    kept: list[str] = []
    last = 0
    for match in _TOOL_CALL_BLOCK.finditer(text):
        call = _read_call(match.group(1), known)
        if call is None:
            continue
        kept.append(text[last : match.start()])
        last = match.end()
        calls.append(call)
    kept.append(text[last:])
    content = "".join(kept).strip() if calls else text
    return (content or None), calls


def _read_call(body: str, known: set[str]) -> ParsedCall | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("name") not in known:
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        return ParsedCall(data["name"], arguments)
    return ParsedCall(data["name"], json.dumps(arguments))
