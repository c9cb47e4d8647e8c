"""What moves bytes to and from an upstream: the body as it is sent (`prepare`), one
keep-alive client per upstream (`UpstreamClients`), and the answer read into the call's
`Outcome` as it passes (`read_answer`, `relay_events`).

Streams pass through event by event with no buffering. The gateway forces
`stream_options.include_usage` upstream so it can charge real usage, and drops the usage
chunk again when the client did not ask for it. What passes is recorded in the Outcome, so a
stream cut off early is charged what was sent.

Upstream requests go over a lean keep-alive HTTP/1.1 client (`inhouse.http.client`, one per
upstream origin), which spends far less CPU per request than httpx.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from inhouse.api.answers import EventSplitter, ToolCallFragment, UsageCounts, event_data, read_chunk
from inhouse.api.auth import auth_headers
from inhouse.api.errors import error_body
from inhouse.gateway.call import Outcome
from inhouse.gateway.config import Upstream
from inhouse.gateway.endpoints import ENDPOINTS
from inhouse.gateway.parsing import output_param
from inhouse.gateway.priority import DEFAULT_CLASS, VLLM_PRIORITY
from inhouse.http.client import Http1Client
from inhouse.http.client import Response as UpstreamResponse


@dataclass(frozen=True, slots=True)
class Forward:
    """One request as it will be sent upstream."""

    body: dict[str, Any]
    upstream: Upstream
    endpoint: str
    client_wants_usage: bool


def prepare(
    upstream: Upstream,
    endpoint: str,
    body: dict[str, Any],
    cache_salt: str | None,
    output_cap: int,
    priority: str = DEFAULT_CLASS,
    adapter: str | None = None,
) -> Forward:
    """The upstream body: model renamed (to the LoRA `adapter` where one is asked for), the
    output cap explicit, usage forced on streams,
    the tenant's cache salt, and the class as vLLM's `priority` integer (to the backends
    that take it; the client's own `priority` never passes: it was read into the class)."""
    out = dict(body)
    out["model"] = upstream.model if adapter is None else adapter
    generates = ENDPOINTS[endpoint].generates
    if generates:
        param, _ = output_param(body)
        out.pop("max_tokens", None)
        out.pop("max_completion_tokens", None)
        out[param] = output_cap
    wants_usage = False
    if out.get("stream"):
        options = dict(out.get("stream_options") or {})
        wants_usage = bool(options.get("include_usage"))
        options["include_usage"] = True
        out["stream_options"] = options
    if upstream.saltable and cache_salt is not None and generates:
        out["cache_salt"] = cache_salt
    else:
        out.pop("cache_salt", None)
    out.pop("priority", None)
    if upstream.prioritized and generates:
        out["priority"] = VLLM_PRIORITY[priority]
    return Forward(out, upstream, endpoint, wants_usage)


class UpstreamClients:
    """One keep-alive client per upstream, sending that upstream's own key (key exchange)."""

    def __init__(self, connect_timeout_s: float = 5.0) -> None:
        self._connect_timeout = connect_timeout_s
        self._clients: dict[tuple[str, str], Http1Client] = {}

    def client(self, upstream: Upstream) -> Http1Client:
        key = (upstream.url, upstream.api_key or "")
        client = self._clients.get(key)
        if client is None:
            headers = auth_headers(upstream.api_key)
            client = self._clients[key] = Http1Client(upstream.url, headers, self._connect_timeout)
        return client

    async def open(self, forward: Forward, stack: contextlib.AsyncExitStack) -> UpstreamResponse:
        """Send the request; the response (body unread) lives until `stack` closes."""
        body = json.dumps(forward.body).encode()
        path = ENDPOINTS[forward.endpoint].path
        exchange = self.client(forward.upstream).post(path, body)
        return await stack.enter_async_context(exchange)

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()


def read_answer(body: bytes, outcome: Outcome, keep_text: bool) -> None:
    """Usage, finish reason and (optionally) text of a non-streamed answer."""
    try:
        answer = read_chunk(body)
    except ValueError:
        return
    _read_usage(outcome, answer.usage)
    if answer.error_type is not None:
        outcome.error_type = answer.error_type
    if answer.choices:
        outcome.finish_reason = answer.choices[0].finish_reason
    if keep_text:
        outcome.text = [c.content for c in answer.choices]
        _add_tool_calls(outcome, answer.choices[0].tool_calls if answer.choices else ())


async def relay_events(
    pieces: AsyncIterator[bytes],
    outcome: Outcome,
    strip_usage: bool,
    clock: Callable[[], float] = time.perf_counter,
) -> AsyncGenerator[bytes, None]:
    """Yield SSE events as soon as each is complete, noting usage and first content."""
    splitter = EventSplitter()
    try:
        async for raw in pieces:
            out = [e for e in splitter.feed(raw) if _note_event(e, outcome, strip_usage, clock)]
            if out:
                yield b"\n\n".join(out) + b"\n\n"
                # Sent: a client that closes on reading [DONE], before the upstream's body
                # ends, had the whole answer (not a 499).
                if any(event_data(e) == b"[DONE]" for e in out):
                    outcome.completed = True
    except OSError as exc:
        outcome.status, outcome.error_type = 502, "upstream_error"
        message = f"the upstream stream broke: {type(exc).__name__}"
        error = error_body(message, "server_error", "upstream_error")
        yield b"data: " + json.dumps(error).encode() + b"\n\n"
    else:
        if splitter.rest.strip():
            yield splitter.rest
    outcome.completed = True


def _note_event(
    event: bytes, outcome: Outcome, strip_usage: bool, clock: Callable[[], float]
) -> bool:
    """Record what the event says; False if it must not reach the client."""
    data = event_data(event)
    if data is None:
        return bool(event.strip())
    try:
        chunk = read_chunk(data)
    except ValueError:
        return True
    if chunk.usage is not None:
        _read_usage(outcome, chunk.usage)
        if not chunk.choices and strip_usage:
            return False
    if chunk.error_type is not None:
        outcome.error_type = chunk.error_type
    for choice in chunk.choices:
        if choice.produced:
            if outcome.first_token_at is None:
                outcome.first_token_at = clock()
            outcome.content_chunks += 1
            if outcome.text is not None:
                outcome.text.append(choice.content)
                if choice.index == 0:
                    _add_tool_calls(outcome, choice.tool_calls)
        if choice.finish_reason:
            outcome.finish_reason = choice.finish_reason
    return True


def _read_usage(outcome: Outcome, usage: UsageCounts | None) -> None:
    """Take the counts the upstream reported."""
    if usage is None:
        return
    if usage.prompt_tokens is not None:
        outcome.prompt_tokens = usage.prompt_tokens
    if usage.completion_tokens is not None:
        outcome.completion_tokens = usage.completion_tokens


def _add_tool_calls(outcome: Outcome, fragments: Iterable[ToolCallFragment]) -> None:
    """Join tool-call fragments: the name comes once, the arguments in pieces."""
    for piece in fragments:
        name, arguments = outcome.tool_calls.get(piece.index, ("", ""))
        outcome.tool_calls[piece.index] = (name or piece.name, arguments + piece.arguments)
