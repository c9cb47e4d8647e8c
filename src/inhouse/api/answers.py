"""OpenAI answers read into typed parts: a stream's SSE events cut at any chunk boundary,
each `data:` payload as a chunk of choice deltas (content, reasoning, tool-call fragments),
usage and error; a non-streamed answer's choices the same way."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_COUNT = 2**53  # a token count above this is not a count (JSON's safe integers)


@dataclass(frozen=True, slots=True)
class ToolCallFragment:
    """A piece of one tool call: the name comes once, the arguments in fragments."""

    index: int
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ChoiceDelta:
    """What one choice adds: a stream's `delta`, a completion's `text` or a whole `message`."""

    index: int
    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCallFragment, ...] = ()
    finish_reason: str | None = None

    @property
    def produced(self) -> bool:
        """Whether the model generated anything here (content, reasoning or a tool call)."""
        return bool(self.content or self.reasoning or self.tool_calls)

    @property
    def text(self) -> str:
        """Everything generated, in order: reasoning, content, tool names and arguments."""
        calls = "".join(c.name + c.arguments for c in self.tool_calls)
        return self.reasoning + self.content + calls


@dataclass(frozen=True, slots=True)
class UsageCounts:
    """Token counts read from an answer's `usage` object; None where a count is missing or not
    a whole number (the server's own response model is :class:`inhouse.api.common.Usage`)."""

    prompt_tokens: int | None
    completion_tokens: int | None


@dataclass(frozen=True, slots=True)
class Chunk:
    """One `data:` payload of a stream, or a whole non-streamed answer."""

    choices: tuple[ChoiceDelta, ...] = ()
    usage: UsageCounts | None = None
    error_message: str | None = None
    error_type: str | None = None
    done: bool = False


DONE = Chunk(done=True)


class EventSplitter:
    """Cuts a byte stream into SSE events at blank lines, whatever the chunk boundaries
    (CRLF line ends are read as LF)."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The events this piece completes, without their blank-line terminator."""
        data = self._buffer + data
        if b"\r" in data:  # a CR whose LF is still to come stays in the buffer
            data = data.replace(b"\r\n", b"\n")
        *events, self._buffer = data.split(b"\n\n")
        return events

    @property
    def rest(self) -> bytes:
        """Bytes of an event not yet terminated."""
        return self._buffer


def event_data(event: bytes) -> bytes | None:
    """The data of an SSE event (its `data:` lines joined by newlines); None when it has none
    (a comment such as `: keep-alive`)."""
    if event.startswith(b"data:") and b"\n" not in event:
        return event[5:].strip()
    lines = [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def read_chunk(payload: bytes) -> Chunk:
    """A stream's data payload (`[DONE]` included) or a non-streamed answer's body as a
    Chunk; ValueError when it is not a JSON object."""
    if payload == b"[DONE]":
        return DONE
    data = json.loads(payload)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    error = data.get("error")
    message = error_type = None
    if isinstance(error, dict):
        message, error_type = str(error.get("message")), str(error.get("type"))
    elif error:
        message, error_type = str(error), "error"
    choices = data.get("choices") or ()
    return Chunk(
        tuple(choice_delta(c) for c in choices if isinstance(c, dict)),
        read_usage(data.get("usage")),
        message,
        error_type,
    )


def choice_delta(choice: dict[str, Any]) -> ChoiceDelta:
    """One element of `choices`, streamed or not, chat or completion."""
    index = choice.get("index")
    index = index if isinstance(index, int) else 0
    finish = choice.get("finish_reason")
    finish = finish if isinstance(finish, str) else None
    if "text" in choice:
        return ChoiceDelta(index, _string(choice.get("text")), finish_reason=finish)
    part = choice.get("delta") or choice.get("message")
    if not isinstance(part, dict):
        return ChoiceDelta(index, finish_reason=finish)
    calls = part.get("tool_calls")
    return ChoiceDelta(
        index,
        _string(part.get("content")),
        _string(part.get("reasoning_content") or part.get("reasoning")),
        tuple(_fragment(c) for c in calls if isinstance(c, dict)) if calls else (),
        finish,
    )


def read_usage(usage: Any) -> UsageCounts | None:
    """The counts of a `usage` object that are whole numbers from 0 to 2^53."""
    if not isinstance(usage, dict) or not usage:
        return None
    return UsageCounts(_count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")))


def _fragment(call: dict[str, Any]) -> ToolCallFragment:
    function = call.get("function")
    function = function if isinstance(function, dict) else {}
    index = call.get("index")
    return ToolCallFragment(
        index if isinstance(index, int) else 0,
        _string(function.get("name")),
        _string(function.get("arguments")),
    )


def _string(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _count(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT
    return value if ok else None
