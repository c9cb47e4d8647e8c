"""Tool-call text conventions and chat-delta translation, without a model."""

from __future__ import annotations

import json

from inhouse.api.chat import NamedToolChoice, ToolDefinition
from inhouse.server.choices import (
    AutoToolCalls,
    NamedToolArguments,
    PlainText,
    RequiredToolCalls,
    merge_deltas,
)
from inhouse.server.tools import forced_tool_schema, parse_tool_calls, tools_system_prompt

WEATHER = ToolDefinition.model_validate(
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
)
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def feed_in_pieces(translator, text: str, size: int, finish: str = "stop"):
    deltas = []
    for i in range(0, len(text), size):
        deltas += translator.feed(text[i : i + size])
    tail, reason = translator.finish(finish)
    return deltas + tail, reason


def test_system_prompt_lists_the_tools_as_json() -> None:
    prompt = tools_system_prompt([WEATHER])
    listed = prompt.split("<tools>\n")[1].split("\n</tools>")[0]
    assert json.loads(listed)["function"]["name"] == "get_weather"


def test_parse_keeps_text_and_unknown_calls_as_content() -> None:
    content, calls = parse_tool_calls(f"Let me check. {CALL}", {"get_weather"})
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    text = '<tool_call>{"name": "launch_rockets", "arguments": {}}</tool_call>'
    assert parse_tool_calls(text, {"get_weather"}) == (text, [])
    assert parse_tool_calls("<tool_call>{not json", {"get_weather"})[1] == []


def test_auto_streaming_holds_back_a_call_and_emits_it_as_deltas() -> None:
    for size in (1, 3, 7, 1000):
        deltas, reason = feed_in_pieces(AutoToolCalls({"get_weather"}), f"Sure. {CALL}", size)
        assert reason == "tool_calls"
        assert all("<tool" not in (d.content or "") for d in deltas)
        message = merge_deltas(deltas)
        assert message.content == "Sure. "
        [call] = message.tool_calls
        assert call.id.startswith("call_") and call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}


def test_auto_without_a_call_streams_plain_text_including_lookalikes() -> None:
    text = "a < b and <tool is not a call"
    deltas, reason = feed_in_pieces(AutoToolCalls({"get_weather"}), text, 2)
    assert reason == "stop"
    assert merge_deltas(deltas).content == text
    assert merge_deltas(deltas).tool_calls is None


def test_named_arguments_stream_and_merge_back() -> None:
    arguments = '{"city": "Paris"}'
    deltas, reason = feed_in_pieces(NamedToolArguments("get_weather"), arguments, 4)
    assert reason == "tool_calls"
    assert deltas[0].tool_calls[0].function.name == "get_weather"
    assert deltas[0].tool_calls[0].id
    message = merge_deltas(deltas)
    assert message.content is None
    assert message.tool_calls[0].function.arguments == arguments


def test_required_output_becomes_calls_unless_cut() -> None:
    text = '[{"name": "get_weather", "arguments": {"city": "Oslo"}}]'
    deltas, reason = feed_in_pieces(RequiredToolCalls(), text, 5)
    assert reason == "tool_calls"
    assert json.loads(merge_deltas(deltas).tool_calls[0].function.arguments) == {"city": "Oslo"}
    cut, reason = feed_in_pieces(RequiredToolCalls(), text[:20], 5, finish="length")
    assert reason == "length" and merge_deltas(cut).content == text[:20]


def test_forced_schemas() -> None:
    named = NamedToolChoice.model_validate(
        {"type": "function", "function": {"name": "get_weather"}}
    )
    assert forced_tool_schema([WEATHER], named, parallel=True) == WEATHER.function.parameters
    required = forced_tool_schema([WEATHER], "required", parallel=False)
    assert required["maxItems"] == 1 and required["minItems"] == 1
    item = required["items"]["anyOf"][0]
    assert item["properties"]["name"] == {"const": "get_weather"}


def test_plain_text_passes_through() -> None:
    deltas, reason = feed_in_pieces(PlainText(), "hello world", 3, finish="length")
    assert reason == "length" and merge_deltas(deltas).content == "hello world"


def test_required_output_cut_by_a_stop_string_stays_text() -> None:
    text = '[{"name": "get_weather", "argu'
    deltas, reason = feed_in_pieces(RequiredToolCalls(), text, 4, finish="stop")
    assert reason == "stop" and merge_deltas(deltas).content == text
