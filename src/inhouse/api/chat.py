"""``POST /v1/chat/completions``: messages, tools, response formats, responses and chunks."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from inhouse.api.bounds import DEFAULT_CHAT_MAX_TOKENS, Logprobs, OutputTokens
from inhouse.api.common import ProtocolModel, SamplingFields, Usage


class TextPart(ProtocolModel):
    """A text content part."""

    type: Literal["text"]
    text: str


class ImageURL(ProtocolModel):
    """Where an image is: an http(s) URL or a data URI."""

    url: str
    detail: str | None = None


class ImagePart(ProtocolModel):
    """An image content part (accepted by the protocol; text-only models refuse it)."""

    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class FunctionCall(ProtocolModel):
    """A function name and its arguments as a JSON string."""

    name: str
    arguments: str


class ToolCall(ProtocolModel):
    """One tool call the assistant made."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(ProtocolModel):
    """One message of the conversation history."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _check_role_fields(self) -> ChatMessage:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a message with role 'tool' needs a tool_call_id")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a message with role {self.role!r} needs content")
        return self


class FunctionDefinition(ProtocolModel):
    """A function the model may call; ``parameters`` is a JSON schema."""

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(ProtocolModel):
    """A tool offered to the model."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(ProtocolModel):
    """The function a named ``tool_choice`` forces."""

    name: str


class NamedToolChoice(ProtocolModel):
    """``tool_choice`` naming one function."""

    type: Literal["function"] = "function"
    function: NamedFunction


class JSONSchemaFormat(ProtocolModel):
    """``response_format.json_schema``: a named schema, ``strict`` optional."""

    name: str = "response"
    description: str | None = None
    schema_: Annotated[dict[str, Any] | None, Field(alias="schema")] = None
    strict: bool | None = None


class ResponseFormat(ProtocolModel):
    """``response_format``: free text, any JSON object, or JSON matching a schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        missing = self.json_schema is None or not self.json_schema.schema_
        if self.type == "json_schema" and missing:
            raise ValueError("response_format of type 'json_schema' needs json_schema.schema")
        return self


class ChatFields(SamplingFields):
    """Every field of a chat request but the conversation itself: what the gateway checks
    before it forwards a request to any backend (which may take more kinds of content)."""

    max_tokens: OutputTokens | None = DEFAULT_CHAT_MAX_TOKENS
    max_completion_tokens: OutputTokens | None = DEFAULT_CHAT_MAX_TOKENS
    logprobs: bool = False
    top_logprobs: Logprobs | None = None

    @model_validator(mode="after")
    def _check_logprobs(self) -> ChatFields:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs set to true")
        return self

    @property
    def completion_limit(self) -> int | None:
        """``max_completion_tokens``, else the deprecated ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens


# What ``chat_template_kwargs`` may not set: the ``messages`` the template reads and the
# parameters of transformers' ``apply_chat_template``, which the server sets itself or
# which change what it returns.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "messages", "conversation", "tools", "documents", "chat_template",
        "add_generation_prompt", "continue_final_message", "tokenize",
        "sanitize_control_tokens", "padding", "truncation", "max_length", "return_tensors",
        "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "kwargs",
    }
)  # fmt: skip


class ChatCompletionRequest(ChatFields):
    """The body of ``POST /v1/chat/completions``."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True

    @field_validator("chat_template_kwargs")
    @classmethod
    def _check_template_kwargs(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        taken = sorted(RESERVED_TEMPLATE_KWARGS.intersection(value or {}))
        if taken:
            raise ValueError(
                f"cannot set {taken[0]!r}, which the server passes to the chat template"
                " itself; use the request's messages, tools and add_generation_prompt"
            )
        return value

    @model_validator(mode="after")
    def _check_tool_choice(self) -> ChatCompletionRequest:
        if isinstance(self.tool_choice, NamedToolChoice) or self.tool_choice == "required":
            names = {t.function.name for t in self.tools or []}
            if not names:
                raise ValueError("tool_choice needs tools")
            named = self.tool_choice
            if isinstance(named, NamedToolChoice) and named.function.name not in names:
                raise ValueError(f"tool_choice names unknown function {named.function.name!r}")
        return self


class TopLogprob(BaseModel):
    """An alternative token at one position."""

    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprobEntry(BaseModel):
    """The chosen token at one position with its alternatives."""

    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = []


class ChoiceLogprobs(BaseModel):
    """``choices[i].logprobs`` of a chat response."""

    content: list[TokenLogprobEntry] | None = None


class AssistantMessage(BaseModel):
    """The assistant's answer."""

    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    """One of the ``n`` answers."""

    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletion(BaseModel):
    """A non-streamed chat response."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class FunctionCallDelta(BaseModel):
    """A piece of a streamed function call."""

    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(BaseModel):
    """A piece of a streamed tool call: the first carries id, type and name."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta


class ChatDelta(BaseModel):
    """What one chunk adds to a choice."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    """One choice's delta in a chunk."""

    index: int
    delta: ChatDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    """One SSE chunk of a streamed chat response."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
