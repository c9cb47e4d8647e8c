"""The call to an upstream: pick a replica (or the fallback), send it the body over
`exchange` (which rewrites it, exchanges the key and reads the answer into the call's
`Outcome`), and settle however it ends. A stream cut off before its usage chunk has its
prompt recounted, so it is charged what it used.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import Response
from starlette.types import Receive

from inhouse.api.errors import CLIENT_CLOSED, APIError, service_unavailable
from inhouse.gateway.adapters.served import fallback_serves, serving
from inhouse.gateway.affinity import prefix_chain, prompt_text
from inhouse.gateway.backends import Backend
from inhouse.gateway.call import Call, Outcome
from inhouse.gateway.exchange import Forward, prepare, read_answer, relay_events
from inhouse.gateway.relay import LeaveWatch, RelayResponse
from inhouse.gateway.releases.canary import apply_release, capped
from inhouse.gateway.routing import Overloaded
from inhouse.gateway.settlement import Ledger, Settler, final_status
from inhouse.gateway.state import GatewayState
from inhouse.http.client import NotAnswered
from inhouse.http.client import Response as UpstreamResponse
from inhouse.http.errors import error_response

KEY_REFUSED = 401  # an upstream's answer to the key the gateway sends it
SHUTTING_DOWN = service_unavailable("the gateway is shutting down; retry on another replica")


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

    def _failed_check(self, call: Call, backend: Backend, reason: str) -> None:
        """Count a failed check against the replica; the model's waiters retry if that took
        it down."""
        if backend.record_failure(self.state.config.health, reason[:200]):
            self.state.router.wake(call.route.name)

    async def _open(
        self, call: Call, body: dict[str, Any], outcome: Outcome, stack: contextlib.AsyncExitStack
    ) -> tuple[UpstreamResponse, Forward] | Response:
        """Send the request to a replica (skipping those that refuse the connection or break
        it before any byte of an answer) or the fallback; its response, or the error
        response when none can take it. An upstream that refuses the gateway's key (401)
        counts as a failed check; a canaried request then goes to the stable release, any
        other is answered 502 (a client whose own key is good never reads a 401)."""
        tried: set[int] = set()
        salt = self.state.keys.cache_salt(call.key)
        choice = len(call.route.backends) > 1 or call.release is not None  # of replicas
        by_prefix = call.route.routing == "prefix" and choice
        asked, pick = call.adapter, call.release
        version = asked if pick is None else pick.answering.sends(asked)
        chain = salt if version is None else f"{salt}/{version}"  # each version its own cache
        prefix = prefix_chain(chain, prompt_text(call.endpoint, body)) if by_prefix else ()
        while True:
            pick = call.release = (
                None if call.release is None else call.release.routable(call.adapter)
            )
            pool, adapter = None, call.adapter
            if pick is not None:  # the release's replicas (serving the version it sends)
                pool, adapter = pick.answering.replicas(adapter), pick.answering.sends(adapter)
            elif adapter is not None:  # the replicas serving it now
                pool = serving(self.state.router, call.route, adapter)
            canaried = pick if pick is not None and pick.stable is not None else None
            may_fall_back = (
                call.key.allow_fallback
                and canaried is None  # the stable's, not ours
                and fallback_serves(call.route, call.adapter)
            )
            try:
                call.lease = await self.state.router.acquire(
                    call.route, call.needs, may_fall_back, frozenset(tried), pool, call.priority,
                    prefix,
                )  # fmt: skip
            except Overloaded as err:
                if canaried is not None:  # the candidate's replicas are busy: the stable answers
                    call.release, tried = canaried.on_stable(), set()
                    continue
                return self.fail(call, outcome, err, err.retry_after_s)
            lease = call.lease
            if lease.fallback:
                self.ledger.fell_back(call.route.name)
            if lease.prefix_blocks:
                self.state.metrics.prefix_routed.labels(call.route.name).inc()
            cap, sent = call.output_cap, body
            if pick is not None:
                cap, sent = capped(cap, pick.answering), apply_release(body, pick.answering)
            forward = prepare(
                lease.upstream, call.endpoint, sent, salt, cap, call.priority, adapter
            )
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
                self._failed_check(call, lease.backend, f"proxy: {exc!r}")
                if canaried is not None:
                    call.release, tried = canaried.on_stable(), set()
                continue
            if upstream.status == KEY_REFUSED:  # the gateway's key for it, not the client's
                await upstream.read()
                error = _key_refused(lease.upstream.name)
                if lease.backend is not None:
                    self._failed_check(call, lease.backend, error.message)
                if canaried is not None:  # a candidate never costs a client its answer
                    self.state.router.release(lease)
                    call.lease = None
                    call.release, tried = canaried.on_stable(), set()
                    continue
                return self.fail(call, outcome, error)
            outcome.status = upstream.status
            return upstream, forward


def _shutdown_event(outcome: Outcome) -> bytes:
    """Note that the shutdown ended the stream; the OpenAI error event that tells the client."""
    outcome.status, outcome.error_type, outcome.completed = 503, SHUTTING_DOWN.type, True
    return b"data: " + json.dumps(SHUTTING_DOWN.body().model_dump()).encode() + b"\n\n"


def _key_refused(upstream: str) -> APIError:
    """Answered when an upstream refuses the gateway's key for it: the gateway is
    misconfigured (its `api_key`, or the variable `--api-key-env` names), the client is not."""
    message = f"upstream {upstream!r} refused the gateway's key for it (HTTP 401)"
    return APIError(502, message, type="server_error", code="upstream_key_refused")


def _upstream_error(exc: BaseException) -> APIError:
    if isinstance(exc, TimeoutError):
        return APIError(504, "the upstream did not answer in time", type="server_error")
    return APIError(502, f"upstream error: {type(exc).__name__}", type="server_error")
