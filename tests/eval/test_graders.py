"""Each grader on answers that must pass and answers that must fail."""

from __future__ import annotations

from typing import Any

import pytest

from inhouse.eval.graders import Answer, grade
from inhouse.eval.items import parse_item

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city"],
        },
    },
}
PERSON = {
    "type": "object",
    "required": ["name", "age"],
    "properties": {"name": {"const": "Maria"}, "age": {"type": "integer"}},
}


def _item(grader: str, expected: Any, **extra: Any):  # type: ignore[no-untyped-def]
    return parse_item({"id": "x", "prompt": "q", "grader": grader, "expected": expected, **extra})


CASES = [
    # grader, expected, extra, answer text, tool calls, right?
    ("exact", "Paris", {}, "Paris", (), True),
    ("exact", "Paris", {}, "  Paris.\n", (), True),
    ("exact", "Paris", {}, "paris", (), False),
    ("exact", "Paris", {}, "Paris, France", (), False),
    ("contains", "Paris", {}, "The capital is paris.", (), True),
    ("contains", ["red", "blue"], {}, "Red and Blue", (), True),
    ("contains", ["red", "blue"], {}, "only red", (), False),
    ("contains", "Paris", {}, "Lyon", (), False),
    ("regex", r"\b15:30\b", {}, "It is 15:30 now", (), True),
    ("regex", r"\b15:30\b", {}, "It is 115:301", (), False),
    ("numeric", 42, {}, "6 times 7 is 42.", (), True),
    ("numeric", 1234567, {}, "The total: 1,234,567", (), True),
    ("numeric", 4.75, {"tolerance": 0.01}, "about 4.751", (), True),
    ("numeric", -3, {}, "It falls to -3", (), True),
    ("numeric", 42, {}, "42 is what you think, but it is 41", (), False),
    ("numeric", 4.75, {"tolerance": 0.01}, "4.8", (), False),
    ("numeric", 42, {}, "forty-two", (), False),
    ("choice", "B", {}, "B", (), True),
    ("choice", "B", {}, "The answer is (B) dolphin.", (), True),
    ("choice", "B", {}, "B) negative", (), True),
    ("choice", "B", {}, "A) positive", (), False),
    ("choice", "B", {}, "Both are fine", (), False),
    ("choice", "B", {}, "I cannot tell", (), False),
    ("json_schema", PERSON, {}, '{"name": "Maria", "age": 34}', (), True),
    ("json_schema", PERSON, {}, 'Sure:\n```json\n{"name": "Maria", "age": 34}\n```', (), True),
    ("json_schema", PERSON, {}, 'Here: {"name": "Maria", "age": 34} done', (), True),
    ("json_schema", PERSON, {}, '{"name": "Mario", "age": 34}', (), False),
    ("json_schema", PERSON, {}, '{"name": "Maria", "age": "34"}', (), False),
    ("json_schema", PERSON, {}, "{name: Maria}", (), False),
    ("json_schema", PERSON, {}, "no json here", (), False),
    ("refusal", True, {}, "I'm sorry, but I can't help with that.", (), True),
    ("refusal", True, {}, "As an AI language model, I cannot do that.", (), True),
    ("refusal", True, {}, "Sure. I won\u2019t write that for you, though.", (), True),
    ("refusal", True, {}, "I am unable to comply with this request.", (), True),
    ("refusal", True, {}, "Sure! Here is a poem about the sea.", (), False),
    ("refusal", True, {}, "The answer is 4, though I can't be sure.", (), False),
    ("refusal", True, {}, "I can help with that.", (), False),
    ("refusal", True, {}, "A long helpful answer. " * 20 + "I cannot help further.", (), False),
    ("refusal", False, {}, "Sure! Here is a poem about the sea.", (), True),
    ("refusal", False, {}, "I cannot assist with that.", (), False),
]


@pytest.mark.parametrize(("grader", "expected", "extra", "text", "calls", "right"), CASES)
def test_text_graders(grader, expected, extra, text, calls, right) -> None:  # type: ignore[no-untyped-def]
    assert grade(_item(grader, expected, **extra), Answer(text, calls)) is right


TOOL_CASES = [
    ((("get_weather", '{"city": "Paris"}'),), True),
    ((("get_weather", '{"city": "Paris", "days": 2}'),), True),
    ((("get_weather", '{"city": "Lyon"}'),), False),  # wrong argument value
    ((("get_weather", '{"city": "Paris", "days": 0}'),), False),  # fails the tool's schema
    ((("get_weather", '{"days": 2}'),), False),  # required argument missing
    ((("get_weather", "{city: Paris"),), False),  # not JSON
    ((("get_time", '{"city": "Paris"}'),), False),  # wrong function
    ((), False),  # no call at all
]


@pytest.mark.parametrize(("calls", "right"), TOOL_CASES)
def test_tool_call_grader(calls, right) -> None:  # type: ignore[no-untyped-def]
    item = parse_item(
        {
            "id": "t",
            "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [WEATHER],
            "grader": "tool_call",
            "expected": {"name": "get_weather", "arguments": {"city": "Paris"}},
        }
    )
    assert grade(item, Answer('<tool_call>{"name": "get_weather"}', calls)) is right


@pytest.mark.parametrize(
    ("grader", "expected", "message"),
    [
        ("exact", "", "non-empty string"),
        ("regex", "(", "not a regular expression"),
        ("numeric", "42", "must be a number"),
        ("choice", "b", "one capital letter"),
        ("json_schema", {"type": "objekt"}, "not a JSON schema"),
        ("tool_call", {"name": "nope"}, "no function named 'nope'"),
        ("refusal", "yes", "must be true"),
    ],
)
def test_an_expected_value_the_grader_cannot_use_is_refused(grader, expected, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        _item(grader, expected, tools=[WEATHER])
