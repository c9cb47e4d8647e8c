"""The shared OpenAI protocol models: ranges, normalisation, and the error body."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from inhouse.api import APIError, ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from inhouse.api.chat import ChatChunkChoice, ChatCompletionChunk, ChatDelta

USER = [{"role": "user", "content": "hi"}]


def test_importing_api_pulls_in_neither_torch_nor_engine() -> None:
    code = "import sys, inhouse.api; print('torch' in sys.modules, 'inhouse.engine' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_stop_string_becomes_list_and_limit_prefers_max_completion_tokens() -> None:
    req = ChatCompletionRequest.model_validate(
        {"messages": USER, "stop": "END", "max_tokens": 5, "max_completion_tokens": 7}
    )
    assert req.stop == ["END"]
    assert req.completion_limit == 7
    assert req.priority == 0  # vLLM's default class
    assert (
        ChatCompletionRequest.model_validate({"messages": USER, "priority": -1000}).priority
        == -1000
    )


@pytest.mark.parametrize(
    "extra",
    [
        {"temperature": 2.5},
        {"top_p": 0},
        {"n": 0},
        {"max_completion_tokens": 0},
        {"top_logprobs": 3},
        {"stop": [""]},
        {"cache_salt": ""},
        {"priority": 1001},
        {"priority": True},
        {"tool_choice": "required"},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
    ],
)
def test_out_of_range_or_inconsistent_fields_are_rejected(extra: dict) -> None:
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"messages": USER, **extra})


def test_json_schema_is_read_from_its_wire_name() -> None:
    req = ChatCompletionRequest.model_validate(
        {
            "messages": USER,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "p", "schema": {"type": "object"}, "strict": True},
            },
        }
    )
    assert req.response_format is not None and req.response_format.json_schema is not None
    assert req.response_format.json_schema.schema_ == {"type": "object"}


def test_named_tool_choice_must_name_an_offered_function() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    ok = {"type": "function", "function": {"name": "get_weather"}}
    ChatCompletionRequest.model_validate({"messages": USER, "tools": tools, "tool_choice": ok})
    bad = {"type": "function", "function": {"name": "nope"}}
    with pytest.raises(ValidationError, match="unknown function"):
        ChatCompletionRequest.model_validate({"messages": USER, "tools": tools, "tool_choice": bad})


def test_tool_message_needs_its_call_id_and_image_parts_parse() -> None:
    with pytest.raises(ValidationError, match="tool_call_id"):
        ChatCompletionRequest.model_validate({"messages": [{"role": "tool", "content": "1"}]})
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    req = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}, image]}]}
    )
    assert req.messages[0].content[1].type == "image_url"  # type: ignore[index,union-attr]


def test_completion_prompt_forms_normalise_to_a_list_of_prompts() -> None:
    assert CompletionRequest(prompt="a").prompts() == ["a"]
    assert CompletionRequest(prompt=[1, 2]).prompts() == [[1, 2]]
    assert CompletionRequest(prompt=[[1], [2]]).prompts() == [[1], [2]]
    assert CompletionRequest(prompt=["a", "b"]).prompts() == ["a", "b"]
    with pytest.raises(ValidationError):
        CompletionRequest(prompt="a", suffix="b")


def test_embedding_input_rejects_an_empty_batch() -> None:
    with pytest.raises(ValidationError):
        EmbeddingRequest(input=[])


def test_error_body_has_openai_shape() -> None:
    body = APIError(400, "bad", param="temperature").body().model_dump()
    assert body == {
        "error": {
            "message": "bad",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": None,
        }
    }


def test_chunk_serialises_without_nulls_in_delta() -> None:
    chunk = ChatCompletionChunk(
        id="c",
        created=1,
        model="m",
        choices=[ChatChunkChoice(index=0, delta=ChatDelta(content="x"))],
    )
    assert '"role"' not in chunk.model_dump_json(exclude_none=True)
