"""Forwarding to an upstream: rewrite the body, exchange the key, relay the answer.

Streams pass through event by event with no buffering. The gateway forces
`stream_options.include_usage` upstream so it can charge real usage, and drops the
usage chunk again when the client did not ask for it. What passes is recorded in an
Outcome, so a stream cut off early is charged what was sent.

Upstream requests go over a lean keep-alive HTTP/1.1 client (one per upstream
origin): ~0.2 ms of CPU per request where httpx spends ~1.2 ms on this machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from inhouse.api.answers import EventSplitter, event_data, read_chunk
from inhouse.api.auth import auth_headers
from inhouse.api.errors import error_body
from inhouse.gateway.call import Outcome
from inhouse.gateway.config import Upstream
from inhouse.gateway.needs import output_param
from inhouse.gateway.priority import DEFAULT_CLASS, VLLM_PRIORITY
from inhouse.http.client import Http1Client
from inhouse.http.client import Response as UpstreamResponse

GENERATING_ENDPOINTS = frozenset({"chat/completions", "completions"})
# Endpoints outside /v1 (vLLM's and `inhouse serve`'s).
UPSTREAM_PATHS = {"tokenize": "/tokenize", "detokenize": "/detokenize"}
LEAVE_WATCH_AFTER_S = 0.25


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
) -> Forward:
    """The upstream body: model renamed, the output cap explicit, usage forced on streams,
    the tenant's cache salt, and the class as vLLM's `priority` integer (to the backends
    that take it; the client's own `priority` never passes: it was read into the class)."""
    out = dict(body)
    out["model"] = upstream.model
    if endpoint in GENERATING_ENDPOINTS:
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
    if upstream.saltable and cache_salt is not None and endpoint in GENERATING_ENDPOINTS:
        out["cache_salt"] = cache_salt
    else:
        out.pop("cache_salt", None)
    out.pop("priority", None)
    if upstream.prioritized and endpoint in GENERATING_ENDPOINTS:
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
        path = UPSTREAM_PATHS.get(forward.endpoint, f"/v1/{forward.endpoint}")
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
    outcome.read_usage(answer.usage)
    if answer.error_type is not None:
        outcome.error_type = answer.error_type
    if answer.choices:
        outcome.finish_reason = answer.choices[0].finish_reason
    if keep_text:
        outcome.text = [c.content for c in answer.choices]
        outcome.add_tool_calls(answer.choices[0].tool_calls if answer.choices else ())


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
        outcome.read_usage(chunk.usage)
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
                    outcome.add_tool_calls(choice.tool_calls)
        if choice.finish_reason:
            outcome.finish_reason = choice.finish_reason
    return True


class RelayResponse(Response):
    """An SSE response that stops and closes upstream the moment the client leaves,
    then always runs `on_close` (which settles limits and writes the audit row) and takes
    the status it returns as its `status_code`: the status the stream ended with, which the
    access log reads, so the log and the audit row agree.

    Cancelled from outside (the server shutting down past its drain deadline), it ends the
    stream the way an upstream error does: the OpenAI error event `shutdown()` returns (it
    also notes the end in the outcome), then `data: [DONE]` (vLLM's ending after an error;
    the `openai` clients raise the error, others stop at [DONE]), and a clean end of the
    body instead of a cut connection."""

    def __init__(
        self,
        chunks: AsyncGenerator[bytes, None],
        upstream: contextlib.AsyncExitStack,
        on_close: Callable[[], int],
        headers: dict[str, str],
        shutdown: Callable[[], bytes],
    ) -> None:
        self._chunks = chunks
        self._upstream = upstream
        self._on_close = on_close
        self._shutdown = shutdown
        self._started = self._ended = False
        self.status_code = 200
        self.background = None
        self.media_type = "text/event-stream"
        self.init_headers({**headers, "cache-control": "no-cache", "x-accel-buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._stream, send, group.cancel_scope)
                group.start_soon(self._watch_disconnect, receive, group.cancel_scope)
        except asyncio.CancelledError:
            with anyio.CancelScope(shield=True):
                await self._end_for_shutdown(send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._chunks.aclose()
                await self._upstream.aclose()
                self.status_code = self._on_close()

    async def _stream(self, send: Send, scope: anyio.CancelScope) -> None:
        await self._start(send)
        async for chunk in self._chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        self._ended = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        scope.cancel()

    async def _start(self, send: Send) -> None:
        self._started = True
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )

    async def _end_for_shutdown(self, send: Send) -> None:
        if self._ended:
            return
        self._ended = True
        body = self._shutdown() + b"data: [DONE]\n\n"
        with contextlib.suppress(OSError):  # the client may be gone too
            if not self._started:
                await self._start(send)
            await send({"type": "http.response.body", "body": body, "more_body": False})

    @staticmethod
    async def _watch_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        scope.cancel()


class LeaveWatch:
    """Watches a non-streamed request's client from `LEAVE_WATCH_AFTER_S` on (an answer
    quicker than that never pays for the task); when the client disconnects, ends the
    wait for upstream at once, which closes the upstream connection."""

    def __init__(
        self, receive: Receive, deadline: asyncio.Timeout, on_leave: Callable[[], None]
    ) -> None:
        self._receive, self._deadline, self._on_leave = receive, deadline, on_leave
        self._task: asyncio.Task[None] | None = None
        self._timer = asyncio.get_running_loop().call_later(LEAVE_WATCH_AFTER_S, self._start)

    def stop(self) -> None:
        self._timer.cancel()
        if self._task is not None:
            self._task.cancel()

    def _start(self) -> None:
        self._task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self._on_leave()
        self._deadline.reschedule(asyncio.get_running_loop().time())
