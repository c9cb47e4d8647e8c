"""Model text to OpenAI chat deltas, per choice: plain content or tool calls.

The same translators serve streamed and whole responses (a whole response is the
merge of its deltas), so both always agree. ``"auto"`` tool choice streams content
until a ``<tool_call>`` may be starting, then holds text back and parses it at the end;
a named function streams its arguments as they are generated; ``"required"`` output is
a JSON array that is parsed once complete.
"""

from __future__ import annotations

from typing import Protocol

from inhouse.api.chat import (
    AssistantMessage,
    ChatDelta,
    FunctionCall,
    FunctionCallDelta,
    NamedToolChoice,
    ToolCall,
    ToolCallDelta,
)
from inhouse.server.tools import (
    TOOL_CALL_OPEN,
    ParsedCall,
    calls_from_forced_output,
    new_tool_call_id,
    parse_tool_calls,
)


class ChoiceTranslator(Protocol):
    """Turns one choice's text deltas into chat deltas."""

    def feed(self, text: str) -> list[ChatDelta]:
        """Deltas for newly generated text (possibly none while text is held back)."""

    def finish(self, finish_reason: str) -> tuple[list[ChatDelta], str]:
        """Deltas for held-back text and the finish reason to report."""


class PlainText:
    """Content as it comes."""

    def feed(self, text: str) -> list[ChatDelta]:
        return [ChatDelta(content=text)] if text else []

    def finish(self, finish_reason: str) -> tuple[list[ChatDelta], str]:
        return [], finish_reason


def _call_deltas(calls: list[ParsedCall], first_index: int = 0) -> list[ChatDelta]:
    deltas = []
    for i, call in enumerate(calls, start=first_index):
        head = ToolCallDelta(
            index=i,
            id=new_tool_call_id(),
            type="function",
            function=FunctionCallDelta(name=call.name, arguments=""),
        )
        body = ToolCallDelta(index=i, function=FunctionCallDelta(arguments=call.arguments))
        deltas += [ChatDelta(tool_calls=[head]), ChatDelta(tool_calls=[body])]
    return deltas


class NamedToolArguments:
    """A forced named function: the output is its arguments, streamed as they come."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._started = False

    def feed(self, text: str) -> list[ChatDelta]:
        deltas = []
        if not self._started:
            self._started = True
            head = ToolCallDelta(
                index=0,
                id=new_tool_call_id(),
                type="function",
                function=FunctionCallDelta(name=self._name, arguments=""),
            )
            deltas.append(ChatDelta(tool_calls=[head]))
        if text:
            body = ToolCallDelta(index=0, function=FunctionCallDelta(arguments=text))
            deltas.append(ChatDelta(tool_calls=[body]))
        return deltas

    def finish(self, finish_reason: str) -> tuple[list[ChatDelta], str]:
        deltas = self.feed("") if not self._started else []
        return deltas, "tool_calls" if finish_reason == "stop" else finish_reason


class RequiredToolCalls:
    """A forced "required" choice: a JSON array of calls, parsed when complete."""

    def __init__(self) -> None:
        self._text: list[str] = []

    def feed(self, text: str) -> list[ChatDelta]:
        self._text.append(text)
        return []

    def finish(self, finish_reason: str) -> tuple[list[ChatDelta], str]:
        text = "".join(self._text)
        try:
            calls = calls_from_forced_output(text, "required")
        except ValueError:  # cut by max_tokens or a stop sequence: the JSON is incomplete
            return ([ChatDelta(content=text)] if text else []), finish_reason
        return _call_deltas(calls), "tool_calls"


class AutoToolCalls:
    """Free output that may contain ``<tool_call>`` blocks naming known functions."""

    def __init__(self, known: set[str]) -> None:
        self._known = known
        self._held = ""
        self._holding = False

    def feed(self, text: str) -> list[ChatDelta]:
        self._held += text
        if self._holding:
            return []
        start = self._held.find(TOOL_CALL_OPEN)
        if start >= 0:
            self._holding = True
            emit, self._held = self._held[:start], self._held[start:]
        else:
            keep = _partial_marker_length(self._held)
            emit, self._held = (
                self._held[: len(self._held) - keep],
                self._held[len(self._held) - keep :],
            )
        return [ChatDelta(content=emit)] if emit else []

    def finish(self, finish_reason: str) -> tuple[list[ChatDelta], str]:
        content, calls = parse_tool_calls(self._held, self._known)
        if not calls:
            return ([ChatDelta(content=self._held)] if self._held else []), finish_reason
        deltas = [ChatDelta(content=content)] if content else []
        reason = "tool_calls" if finish_reason == "stop" else finish_reason
        return deltas + _call_deltas(calls), reason


def _partial_marker_length(text: str) -> int:
    """Length of the longest suffix of ``text`` that begins ``<tool_call>``."""
    for size in range(min(len(TOOL_CALL_OPEN) - 1, len(text)), 0, -1):
        if TOOL_CALL_OPEN.startswith(text[-size:]):
            return size
    return 0


def translator_for(
    tool_choice: str | NamedToolChoice | None, known_tools: set[str]
) -> ChoiceTranslator:
    """The translator for a request's tool setup."""
    if isinstance(tool_choice, NamedToolChoice):
        return NamedToolArguments(tool_choice.function.name)
    if tool_choice == "required":
        return RequiredToolCalls()
    if known_tools and tool_choice in (None, "auto"):
        return AutoToolCalls(known_tools)
    return PlainText()


def merge_deltas(deltas: list[ChatDelta]) -> AssistantMessage:
    """The whole message the deltas add up to (what a client reassembles)."""
    content = "".join(d.content or "" for d in deltas)
    calls: dict[int, dict[str, str]] = {}
    for delta in deltas:
        for piece in delta.tool_calls or []:
            call = calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
            call["id"] = piece.id or call["id"]
            call["name"] = piece.function.name or call["name"]
            call["arguments"] += piece.function.arguments or ""
    tool_calls = [
        ToolCall(id=c["id"], function=FunctionCall(name=c["name"], arguments=c["arguments"]))
        for _, c in sorted(calls.items())
    ]
    has_content = any(d.content is not None for d in deltas)
    return AssistantMessage(
        content=content if has_content or not tool_calls else None,
        tool_calls=tool_calls or None,
    )
