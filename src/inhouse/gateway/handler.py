"""One request through the gateway: authenticate, check, admit, route, forward, settle, audit."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.responses import Response
from starlette.types import Receive

from inhouse.api.body import json_object
from inhouse.api.errors import (
    APIError,
    authentication_error,
    invalid_request,
    not_found,
    server_error,
    service_unavailable,
)
from inhouse.gateway.audit import AuditRecord, AuditWriter, Redactor
from inhouse.gateway.config import GatewayConfig, ModelRoute
from inhouse.gateway.keys import ApiKey, AuthError, KeyStore
from inhouse.gateway.limits import Admission, KeyLimiter, limit_error, quota_refusal
from inhouse.gateway.metrics import GatewayMetrics
from inhouse.gateway.needs import BadRequest, Needs, read_needs
from inhouse.gateway.proxy import (
    Forward,
    LeaveWatch,
    Outcome,
    RelayResponse,
    UpstreamClients,
    prepare,
    read_answer,
    relay_events,
)
from inhouse.gateway.routing import Lease, Overloaded, Router
from inhouse.gateway.tokens import budget
from inhouse.http1 import Response as UpstreamResponse
from inhouse.http_errors import error_response

T = TypeVar("T")
CLIENT_CLOSED = 499  # nginx's "client closed request"
SHUTTING_DOWN = service_unavailable("the gateway is shutting down; retry on another replica")
DRAIN_SETTLE_S = 2.0
UNMETERED_ENDPOINTS = frozenset({"tokenize", "detokenize"})  # no model runs: no RPM, TPM, quota
log = logging.getLogger("inhouse.gateway")
AUTH_MESSAGES = {
    "missing": "Missing API key: send it as 'Authorization: Bearer <key>'.",
    "invalid": "Incorrect API key provided.",
    "revoked": "This API key has been revoked.",
    "expired": "This API key has expired.",
}


@dataclass(slots=True)
class Call:
    """A request that passed admission, carried to its settlement."""

    key: ApiKey
    route: ModelRoute
    endpoint: str
    needs: Needs
    prompt: int
    output_cap: int
    reserve: int
    stream: bool
    ts: float
    started: float
    headers: dict[str, str]
    prompt_text: str | None
    lease: Lease | None = None
    settled: bool = False
    client_left: bool = False
    metered: bool = True  # False: runs no model, charges no tokens (/tokenize, /detokenize)


class Gateway:
    """The request flow, over the objects that hold the gateway's state."""

    def __init__(
        self,
        config: GatewayConfig,
        keys: KeyStore,
        limiter: KeyLimiter,
        router: Router,
        audit: AuditWriter,
        metrics: GatewayMetrics,
        upstreams: UpstreamClients,
        limits_block: bool,
    ) -> None:
        self.config = config
        self.keys = keys
        self.limiter = limiter
        self.router = router
        self.audit = audit
        self.metrics = metrics
        self.upstreams = upstreams
        self._limits_block = limits_block
        self._redact = Redactor(config.audit.redact)
        self._tasks: set[asyncio.Task[None]] = set()
        self.active = 0  # admitted requests not yet settled

    async def authenticate(self, header: str) -> ApiKey:
        """The live key named by an Authorization header, or a 401 APIError."""
        scheme, _, secret = header.partition(" ")
        presented = secret.strip() if scheme.lower() == "bearer" else None
        try:
            if self.keys.lookup_is_local:
                return self.keys.authenticate(presented)
            return await asyncio.to_thread(self.keys.authenticate, presented)
        except AuthError as err:
            raise authentication_error(AUTH_MESSAGES[err.reason]) from None

    async def handle(
        self, authorization: str, raw: bytes, endpoint: str, receive: Receive | None = None
    ) -> Response:
        """Answer one OpenAI API call (its Authorization header and body) on behalf of a key.

        With `receive`, a non-streamed request whose client disconnects is cancelled upstream.
        """
        ts, started = time.time(), time.perf_counter()
        key: ApiKey | None = None
        model: str | None = None
        try:
            key = await self.authenticate(authorization)
            body = json_object(raw)
            model = body.get("model") if isinstance(body.get("model"), str) else None
            route = self._route(key, model)
            needs = read_needs(endpoint, body)
            why = self.router.refusal(route, needs, key.allow_fallback)
            if why is not None:
                raise invalid_request(
                    f"{why} (model {route.name!r})", code="unsupported_capability"
                )
        except BadRequest as err:
            return self._refuse(
                invalid_request(str(err), err.param), key, model, endpoint, ts, started
            )
        except APIError as err:
            return self._refuse(err, key, model, endpoint, ts, started)
        prompt, cap = await budget(self.upstreams, self.router, key, route, endpoint, body, needs)
        reserve = needs.reserve(prompt, cap)
        metered = endpoint not in UNMETERED_ENDPOINTS
        admission = await self._limits(self.limiter.admit, key, reserve, metered)
        if admission.allowed and metered and key.quota_tokens is not None:
            admission = await self._reserve_quota(key, reserve, ts, admission.headers)
        if not admission.allowed:
            err = limit_error(admission.reason or "requests", admission.message)
            return self._refuse(
                err, key, model, endpoint, ts, started, admission.headers, admission.retry_after_s
            )
        call = Call(
            key, route, endpoint, needs, prompt, cap, reserve, bool(body.get("stream")), ts,
            started, admission.headers, self._prompt_text(key, body), metered=metered,
        )  # fmt: skip
        self.active += 1
        try:
            return await self._forward(call, body, receive)
        except Exception:  # a bug must not leak the key's slots: answer 500 and settle
            log.exception("gateway: request to model %r failed", route.name)
            if call.settled:
                return error_response(server_error(), call.headers)
            return await self._fail(call, Outcome(), server_error(), None)

    async def _forward(self, call: Call, body: dict[str, Any], receive: Receive | None) -> Response:
        outcome = Outcome()
        stack = contextlib.AsyncExitStack()
        watch: LeaveWatch | None = None
        try:
            async with asyncio.timeout(self.config.request_timeout_s) as deadline:
                if receive is not None and not call.stream:
                    watch = LeaveWatch(receive, deadline, functools.partial(_left, call))
                opened = await self._open(call, body, outcome, stack)
                if isinstance(opened, Response):
                    return opened
                upstream, forward = opened
                if outcome.status == 200 and call.stream:
                    if call.key.log_content:
                        outcome.text = []
                    strip = not forward.client_wants_usage
                    chunks = relay_events(upstream.iter_body(), outcome, strip)
                    settle = functools.partial(self._settle, call, outcome)
                    return RelayResponse(chunks, stack, settle, call.headers)
                answer = await upstream.read()
        except (OSError, TimeoutError) as exc:
            await stack.aclose()
            if call.client_left and not call.settled:  # answered to nobody: the client left
                outcome.status, outcome.error_type = CLIENT_CLOSED, "client_disconnected"
                outcome.completed = True
                self._settle_soon(call, outcome)
                return Response(status_code=CLIENT_CLOSED)
            return await self._fail(call, outcome, _upstream_error(exc), None)
        except asyncio.CancelledError:  # shutdown past its drain deadline: the request ends
            await stack.aclose()
            if call.settled:
                raise
            return await self._fail(call, outcome, SHUTTING_DOWN, None)
        finally:
            if watch is not None:
                watch.stop()
        await stack.aclose()
        read_answer(answer, outcome, call.key.log_content)
        outcome.completed = True
        self._settle_soon(call, outcome)
        media = upstream.headers.get("content-type", "application/json")
        return Response(answer, outcome.status, headers=call.headers, media_type=media)

    async def _open(
        self, call: Call, body: dict[str, Any], outcome: Outcome, stack: contextlib.AsyncExitStack
    ) -> tuple[UpstreamResponse, Forward] | Response:
        """Send the request to a replica (skipping those that refuse the connection) or the
        fallback; its response, or the error response when none can take it."""
        tried: set[int] = set()
        while True:
            try:
                call.lease = await self.router.acquire(
                    call.route, call.needs, call.key.allow_fallback, frozenset(tried)
                )
            except Overloaded as err:
                return await self._fail(call, outcome, err, err.retry_after_s)
            lease = call.lease
            if lease.fallback:
                self.metrics.fallbacks.labels(call.route.name).inc()
            salt = self.keys.cache_salt(call.key)
            forward = prepare(lease.upstream, call.endpoint, body, salt, call.output_cap)
            try:
                upstream = await self.upstreams.open(forward, stack)
            except (ConnectionRefusedError, socket.gaierror) as exc:
                self.router.release(lease)
                call.lease = None
                if lease.backend is None:
                    err = service_unavailable(
                        f"the fallback for {call.route.name!r} is unreachable"
                    )
                    return await self._fail(call, outcome, err, None)
                tried.add(id(lease.backend))
                if lease.backend.record_failure(self.config.health, f"proxy: {exc!r}"[:200]):
                    self.router.wake(call.route.name)
                continue
            outcome.status = upstream.status
            return upstream, forward

    async def _settle(self, call: Call, outcome: Outcome) -> None:
        """Charge real usage, free the slots, write metrics and the audit row."""
        await self._settle_limits(call, self._account(call, outcome))

    def _settle_soon(self, call: Call, outcome: Outcome) -> None:
        """`_settle` inline when no limit lives in the database, else in a task (no wait)."""
        charged = self._account(call, outcome)
        if self._limits_block or call.key.quota_tokens is not None:
            self._spawn(self._settle_limits(call, charged))
            return
        self.limiter.settle(call.key, call.reserve, charged)
        self.limiter.release(call.key)

    def _account(self, call: Call, outcome: Outcome) -> int:
        """Free the replica slot, write metrics and the audit row; the tokens to charge."""
        call.settled = True
        self.active -= 1
        reached = call.lease is not None and outcome.status != 0
        prompt = outcome.prompt_tokens
        if prompt is None:
            prompt = call.prompt if reached else 0
        completion = outcome.completion_tokens
        if completion is None:
            completion = outcome.content_chunks
        if not call.metered:
            prompt = completion = 0
        charged = prompt + completion
        if call.lease is not None:
            self.router.release(call.lease)
        end = time.perf_counter()
        name, model = call.key.name, call.route.name
        status = outcome.status if outcome.completed or not reached else 499
        ttft = None if outcome.first_token_at is None else outcome.first_token_at - call.started
        self.metrics.observe_request(
            name, model, status, (prompt, completion), end - call.started, ttft
        )
        if outcome.prompt_tokens is not None:  # context creep on real tokens, not the estimate
            self.metrics.observe_prompt(model, outcome.prompt_tokens)
        lease = call.lease
        self.audit.record(
            AuditRecord(
                ts=call.ts,
                key_name=name,
                model=model,
                endpoint=call.endpoint,
                status=status,
                backend=None if lease is None else lease.upstream.name,
                error_type=outcome.error_type,
                stream=call.stream,
                prompt_tokens=prompt,
                completion_tokens=completion,
                reserved_tokens=call.reserve,
                latency_ms=(end - call.started) * 1000,
                ttft_ms=None if ttft is None else ttft * 1000,
                finish_reason=outcome.finish_reason,
                fallback_used=lease is not None and lease.fallback,
                prompt_text=call.prompt_text,
                completion_text=None
                if outcome.text is None
                else self._redact("".join(outcome.text)),
            )
        )
        return charged

    async def _settle_limits(self, call: Call, charged: int) -> None:
        await self._limits(self.limiter.settle, call.key, call.reserve, charged)
        if call.key.quota_tokens is not None:
            await asyncio.to_thread(
                self.keys.settle_quota, call.key, call.ts, call.reserve, charged
            )
        self.limiter.release(call.key)

    async def _fail(
        self, call: Call, outcome: Outcome, err: APIError, retry_after: float | None
    ) -> Response:
        outcome.status, outcome.completed = err.status_code, True
        outcome.error_type = err.type
        reason = "no_backend" if err.status_code == 503 else (err.code or err.type)
        self.metrics.rejections.labels(call.key.name, call.route.name, reason).inc()
        if not call.settled:  # a deadline can end a request whose refusal already settled it
            await self._settle(call, outcome)
        return error_response(err, call.headers, retry_after)

    def _refuse(
        self,
        err: APIError,
        key: ApiKey | None,
        model: str | None,
        endpoint: str,
        ts: float,
        started: float,
        headers: dict[str, str] | None = None,
        retry_after: float | None = None,
    ) -> Response:
        name = None if key is None else key.name
        reason = err.code or err.type
        self.metrics.rejections.labels(name or "", model or "", reason).inc()
        self.metrics.requests.labels(name or "", model or "", str(err.status_code)).inc()
        self.audit.record(
            AuditRecord(
                ts=ts,
                key_name=name,
                model=model,
                endpoint=endpoint,
                status=err.status_code,
                error_type=err.type,
                latency_ms=(time.perf_counter() - started) * 1000,
            )
        )
        if key is not None and headers is None:
            headers = self.limiter.headers(key)
        return error_response(err, headers, retry_after)

    def _route(self, key: ApiKey, model: str | None) -> ModelRoute:
        if model is None:
            raise invalid_request("'model' is required", "model")
        route = self.config.model(model)
        if route is None or not key.may_use(model):
            raise not_found(
                f"The model '{model}' does not exist or you do not have access to it.",
                "model",
                "model_not_found",
            )
        return route

    def _prompt_text(self, key: ApiKey, body: dict[str, Any]) -> str | None:
        if not key.log_content:
            return None
        content = body.get("messages", body.get("prompt", body.get("input")))
        return self._redact(content if isinstance(content, str) else json.dumps(content))

    async def _reserve_quota(
        self, key: ApiKey, reserve: int, ts: float, headers: dict[str, str]
    ) -> Admission:
        """Hold `reserve` tokens of the key's quota, or withdraw the admission just made."""
        used = await asyncio.to_thread(self.keys.reserve_quota, key, reserve, ts)
        if used is None:
            return Admission(True, headers=headers)
        await self._limits(self.limiter.withdraw, key, reserve)
        return quota_refusal(key, used, reserve, ts, headers)

    async def _limits(self, fn: Callable[..., T], *args: Any) -> T:
        if self._limits_block:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout_s: float = DRAIN_SETTLE_S) -> None:
        """On shutdown: let cancelled requests settle (bounded), then wait for settlements."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self.active:
                    await asyncio.sleep(0.01)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _left(call: Call) -> None:
    call.client_left = True


def _upstream_error(exc: BaseException) -> APIError:
    if isinstance(exc, TimeoutError):
        return APIError(504, "the upstream did not answer in time", type="server_error")
    return APIError(502, f"upstream error: {type(exc).__name__}", type="server_error")
