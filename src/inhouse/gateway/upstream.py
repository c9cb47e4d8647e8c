"""The call to an upstream, and the only writer of its `Outcome`: pick a replica (or the
fallback), rewrite the body, exchange the key, relay the answer, settle however it ends.

Streams pass through event by event with no buffering. The gateway forces
`stream_options.include_usage` upstream so it can charge real usage, and drops the
usage chunk again when the client did not ask for it. What passes is recorded in the
Outcome, so a stream cut off early is charged what was sent, and its prompt is recounted
(it never got the usage chunk).

Upstream requests go over a lean keep-alive HTTP/1.1 client (`inhouse.http.client`, one per
upstream origin), which spends far less CPU per request than httpx.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response
from starlette.types import Receive

from inhouse.api.answers import EventSplitter, ToolCallFragment, UsageCounts, event_data, read_chunk
from inhouse.api.auth import auth_headers
from inhouse.api.errors import CLIENT_CLOSED, APIError, error_body, service_unavailable
from inhouse.gateway.call import Call, Outcome
from inhouse.gateway.config import Upstream
from inhouse.gateway.endpoints import ENDPOINTS
from inhouse.gateway.parsing import output_param
from inhouse.gateway.priority import DEFAULT_CLASS, VLLM_PRIORITY
from inhouse.gateway.relay import LeaveWatch, RelayResponse
from inhouse.gateway.releases.canary import apply_release, capped
from inhouse.gateway.routing import Overloaded
from inhouse.gateway.settlement import Ledger, Settler, final_status
from inhouse.gateway.state import GatewayState
from inhouse.http.client import Http1Client, NotAnswered
from inhouse.http.client import Response as UpstreamResponse
from inhouse.http.errors import error_response

SHUTTING_DOWN = service_unavailable("the gateway is shutting down; retry on another replica")


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


@dataclass(slots=True)
class Forwarder:
    """Sends admitted calls upstream and answers the client with what comes back."""

    state: GatewayState
    settler: Settler
    ledger: Ledger
    # the prompt tokens of an answer cut off before its usage (`admission.count_cut_prompt`)
    count_cut_prompt: Callable[[Call, dict[str, Any]], Awaitable[int]]

    async def forward(self, call: Call, body: dict[str, Any], receive: Receive | None) -> Response:
        """The client's answer. With `receive`, a non-streamed call whose client disconnects
        is cancelled upstream."""
        outcome = Outcome()
        stack = contextlib.AsyncExitStack()
        watch: LeaveWatch | None = None
        try:
            async with asyncio.timeout(self.state.config.request_timeout_s) as deadline:
                if receive is not None and not call.stream:
                    watch = LeaveWatch(receive, deadline, call.leave)
                opened = await self._open(call, body, outcome, stack)
                if isinstance(opened, Response):
                    return opened
                upstream, forward = opened
                if outcome.status == 200 and call.stream:
                    if call.keeps_text:
                        outcome.text = []
                    strip = not forward.client_wants_usage
                    chunks = relay_events(upstream.iter_body(), outcome, strip)
                    return RelayResponse(
                        chunks, stack, lambda: self._close_stream(call, outcome, body),
                        call.headers,
                        lambda: _shutdown_event(outcome),
                    )  # fmt: skip
                answer = await upstream.read()
        except (OSError, TimeoutError) as exc:
            await stack.aclose()
            if call.client_left and not call.settled:  # answered to nobody: the client left
                outcome.status, outcome.error_type = CLIENT_CLOSED, "client_disconnected"
                outcome.completed = True
                await self._count_cut(call, outcome, body)
                self.settler.settle(call, outcome)
                return Response(status_code=CLIENT_CLOSED)
            return self.fail(call, outcome, _upstream_error(exc))
        except asyncio.CancelledError:  # shutdown past its drain deadline: the request ends
            await stack.aclose()
            if call.settled:
                raise
            return self.fail(call, outcome, SHUTTING_DOWN)
        finally:
            if watch is not None:
                watch.stop()
        await stack.aclose()
        read_answer(answer, outcome, call.keeps_text)
        outcome.completed = True
        self.settler.settle(call, outcome)
        media = upstream.headers.get("content-type", "application/json")
        return Response(answer, outcome.status, headers=call.headers, media_type=media)

    async def _close_stream(self, call: Call, outcome: Outcome, body: dict[str, Any]) -> int:
        """Settle a stream that ended (however it did); the status it ended with."""
        await self._count_cut(call, outcome, body)
        self.settler.settle(call, outcome)
        return final_status(call, outcome)

    async def _count_cut(self, call: Call, outcome: Outcome, body: dict[str, Any]) -> None:
        """Count the prompt of an answer an upstream started but whose usage never came
        (its client left, or the stream broke), so it is charged what it used."""
        unreported = outcome.status != 0 and outcome.prompt_tokens is None
        if unreported and call.metered and call.lease is not None and not call.settled:
            outcome.prompt_counted = await self.count_cut_prompt(call, body)

    def fail(
        self, call: Call, outcome: Outcome | None, error: APIError,
        retry_after: float | None = None,
    ) -> Response:  # fmt: skip
        """Answer `error` and settle the call with it (unless it is settled already); no
        `outcome` when nothing was sent upstream."""
        outcome = Outcome() if outcome is None else outcome
        outcome.status, outcome.completed = error.status_code, True
        outcome.error_type = error.type
        self.ledger.failed(call, error)
        self.settler.settle(call, outcome)
        return error_response(error, call.headers, retry_after)

    async def _open(
        self, call: Call, body: dict[str, Any], outcome: Outcome, stack: contextlib.AsyncExitStack
    ) -> tuple[UpstreamResponse, Forward] | Response:
        """Send the request to a replica (skipping those that refuse the connection or break
        it before any byte of an answer) or the fallback; its response, or the error
        response when none can take it."""
        tried: set[int] = set()
        while True:
            pick = call.release = None if call.release is None else call.release.routable()
            pool = None if pick is None else pick.answering.pool
            canaried = pick if pick is not None and pick.stable is not None else None
            may_fall_back = call.key.allow_fallback and canaried is None  # the stable's, not ours
            try:
                call.lease = await self.state.router.acquire(
                    call.route, call.needs, may_fall_back, frozenset(tried), pool, call.priority
                )
            except Overloaded as err:
                if canaried is not None:  # the candidate's replicas are busy: the stable answers
                    call.release, tried = canaried.on_stable(), set()
                    continue
                return self.fail(call, outcome, err, err.retry_after_s)
            lease = call.lease
            if lease.fallback:
                self.ledger.fell_back(call.route.name)
            salt = self.state.keys.cache_salt(call.key)
            cap, sent = call.output_cap, body
            if pick is not None:
                cap, sent = capped(cap, pick.answering), apply_release(body, pick.answering)
            forward = prepare(lease.upstream, call.endpoint, sent, salt, cap, call.priority)
            try:
                upstream = await self.state.upstreams.open(forward, stack)
            except (ConnectionRefusedError, socket.gaierror, NotAnswered) as exc:
                self.state.router.release(lease)
                call.lease = None
                if lease.backend is None:
                    error = service_unavailable(
                        f"the fallback for {call.route.name!r} is unreachable"
                    )
                    return self.fail(call, outcome, error)
                tried.add(id(lease.backend))
                if lease.backend.record_failure(self.state.config.health, f"proxy: {exc!r}"[:200]):
                    self.state.router.wake(call.route.name)
                if canaried is not None:
                    call.release, tried = canaried.on_stable(), set()
                continue
            outcome.status = upstream.status
            return upstream, forward


def _shutdown_event(outcome: Outcome) -> bytes:
    """Note that the shutdown ended the stream; the OpenAI error event that tells the client."""
    outcome.status, outcome.error_type, outcome.completed = 503, SHUTTING_DOWN.type, True
    return b"data: " + json.dumps(SHUTTING_DOWN.body().model_dump()).encode() + b"\n\n"


def _upstream_error(exc: BaseException) -> APIError:
    if isinstance(exc, TimeoutError):
        return APIError(504, "the upstream did not answer in time", type="server_error")
    return APIError(502, f"upstream error: {type(exc).__name__}", type="server_error")


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
