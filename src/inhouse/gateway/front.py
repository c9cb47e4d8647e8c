"""The gateway's ASGI entry point: the proxied OpenAI routes as raw ASGI, the rest via FastAPI.

POST /v1/chat/completions, /v1/completions, /v1/embeddings, /tokenize and /detokenize go
straight to
`Gateway.handle` with the Authorization header and the body: FastAPI's middleware
stack, routing and Request object would cost more CPU than the gateway's own work.
Everything else (health, metrics, models, lifespan) goes to the FastAPI app.
"""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inhouse.api.errors import server_error
from inhouse.gateway.access_log import AccessLog
from inhouse.gateway.authn import authorization_values
from inhouse.gateway.handler import Gateway
from inhouse.http.errors import error_response, method_not_allowed

log = logging.getLogger("inhouse.gateway")

PROXIED = {
    "/v1/chat/completions": "chat/completions",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/tokenize": "tokenize",
    "/detokenize": "detokenize",
}


class GatewayFront:
    """Dispatches each request and, when `access_log` is given, logs it."""

    def __init__(self, gateway: Gateway, app: ASGIApp, access_log: AccessLog | None) -> None:
        self._gateway = gateway
        self._app = app
        self._access_log = access_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        fields: dict[str, str] = {}
        try:
            status = await self._dispatch(scope, receive, send, fields)
        finally:
            if self._access_log is not None:
                self._access_log.write(scope, status, time.perf_counter() - started, fields)

    async def _dispatch(
        self, scope: Scope, receive: Receive, send: Send, fields: dict[str, str]
    ) -> int:
        """Answer the request; the status it got."""
        endpoint = PROXIED.get(scope["path"])
        if endpoint is None:
            return await _answer_noting_status(self._app, scope, receive, send)
        if scope["method"] == "POST":
            authorization = authorization_values(scope["headers"])
            body = await read_body(receive)
            try:
                response = await self._gateway.handle(
                    authorization, body, endpoint, receive, fields
                )
            except Exception:  # a bug: still OpenAI's error body, never a plain-text 500
                log.exception("gateway: unhandled error on %s", scope["path"])
                response = error_response(server_error())
        else:
            refused = method_not_allowed(scope["method"], scope["path"])
            response = error_response(refused, {"allow": "POST"})
        await response(scope, receive, send)
        return response.status_code  # a stream's is the status it ended with (`RelayResponse`)


async def _answer_noting_status(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> int:
    status = 500

    async def send_noting_status(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        await send(message)

    await app(scope, receive, send_noting_status)
    return status


async def read_body(receive: Receive) -> bytes:
    """The whole request body (`BodySizeLimit` in front of this app caps its size)."""
    message = await receive()
    body = message.get("body", b"")
    if not message.get("more_body", False):
        return body
    parts = [body]
    while message.get("more_body", False):
        message = await receive()
        parts.append(message.get("body", b""))
    return b"".join(parts)
