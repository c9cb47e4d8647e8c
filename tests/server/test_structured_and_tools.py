"""response_format and tools over HTTP: outputs always parse and validate."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING

import jsonschema
import pytest

if TYPE_CHECKING:
    from conftest import RunningServer

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
SCHEMAS = json.loads((Path(__file__).parents[1] / "data" / "json_schemas.json").read_text())
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a timezone.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string"}},
            "required": ["timezone"],
        },
    },
}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
SCHEMAS_BY_NAME = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}


def test_twenty_json_schemas_always_validate(server: RunningServer) -> None:
    client = server.async_client()

    async def one(schema: dict) -> tuple[str, str | None]:
        reply = await client.chat.completions.create(
            model=MODEL,
            messages=[
                {
                    "role": "user",
                    "content": "Give an example JSON object for this schema: " + json.dumps(schema),
                }
            ],
            temperature=0,
            max_tokens=400,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "example", "schema": schema, "strict": True},
            },
        )
        return reply.choices[0].message.content, reply.choices[0].finish_reason

    async def all_of_them() -> list[tuple[str, str | None]]:
        return await asyncio.gather(*(one(s) for s in SCHEMAS))

    results = asyncio.run(all_of_them())
    for schema, (text, finish) in zip(SCHEMAS, results, strict=True):
        assert finish == "stop", f"cut before the JSON ended: {text!r}"
        jsonschema.validate(json.loads(text), schema)


def test_json_object_mode_gives_an_object(server: RunningServer) -> None:
    reply = server.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a cat as JSON."}],
        temperature=0,
        max_tokens=400,
        response_format={"type": "json_object"},
    )
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_tool_choice_required_gives_valid_calls(server: RunningServer) -> None:
    reply = server.client().chat.completions.create(
        model=MODEL,
        messages=ASK_WEATHER,
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,  # one call: the 135M model repeats calls up to the cap
        temperature=0,
        max_tokens=400,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(choice.message.tool_calls) == 1
    for call in choice.message.tool_calls:
        assert call.id.startswith("call_") and call.type == "function"
        jsonschema.validate(
            json.loads(call.function.arguments), SCHEMAS_BY_NAME[call.function.name]
        )


def _named_call(server: RunningServer, stream: bool):
    return server.client().chat.completions.create(
        model=MODEL,
        messages=ASK_WEATHER,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0,
        max_tokens=80,
        stream=stream,
    )


def test_named_tool_choice_calls_that_function_with_valid_arguments(
    server: RunningServer,
) -> None:
    choice = _named_call(server, stream=False).choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS_BY_NAME["get_weather"])


def test_streamed_tool_call_deltas_reassemble_to_the_same_call(server: RunningServer) -> None:
    whole = _named_call(server, stream=False).choices[0].message.tool_calls[0]
    chunks = [c for c in _named_call(server, stream=True) if c.choices]
    pieces = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    first, rest = pieces[0], pieces[1:]
    assert first.id and first.type == "function" and first.function.name == "get_weather"
    assert len(rest) >= 2, "arguments should arrive in several fragments"
    assert all(p.id is None and p.function.name is None for p in rest)
    arguments = "".join(p.function.arguments or "" for p in pieces)
    assert arguments == whole.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_tool_result_then_an_answer(server: RunningServer) -> None:
    client = server.client()
    call = _named_call(server, stream=False).choices[0].message.tool_calls[0]
    history = [
        *ASK_WEATHER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "clear"}'},
    ]
    reply = client.chat.completions.create(
        model=MODEL, messages=history, tools=[WEATHER], temperature=0, max_tokens=30
    )
    choice = reply.choices[0]
    assert choice.message.content
    assert choice.finish_reason in {"stop", "length", "tool_calls"}


def test_tool_choice_none_answers_in_text(server: RunningServer) -> None:
    reply = server.client().chat.completions.create(
        model=MODEL,
        messages=ASK_WEATHER,
        tools=[WEATHER],
        tool_choice="none",
        max_tokens=8,
        temperature=0,
    )
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content
