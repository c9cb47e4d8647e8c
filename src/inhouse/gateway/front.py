"""The gateway's ASGI entry point: the proxied OpenAI routes as raw ASGI, the rest via FastAPI.

POST /v1/chat/completions, /v1/completions and /v1/embeddings go straight to
`Gateway.handle` with the Authorization header and the body: FastAPI's middleware
stack, routing and Request object would cost more CPU than the gateway's own work.
Everything else (health, metrics, models, lifespan) goes to the FastAPI app.
"""

from __future__ import annotations

import time

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inhouse.gateway.access_log import AccessLog
from inhouse.gateway.handler import Gateway

PROXIED = {
    "/v1/chat/completions": "chat/completions",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
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
        if self._access_log is None:
            await self._dispatch(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._dispatch(scope, receive, send_noting_status)
        finally:
            self._access_log.write(scope, status or 500, time.perf_counter() - started)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = PROXIED.get(scope["path"])
        if endpoint is None:
            await self._app(scope, receive, send)
            return
        if scope["method"] != "POST":
            refusal = PlainTextResponse("Method Not Allowed", 405, headers={"allow": "POST"})
            await refusal(scope, receive, send)
            return
        authorization = ""
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
                break
        response = await self._gateway.handle(authorization, await read_body(receive), endpoint)
        await response(scope, receive, send)


async def read_body(receive: Receive) -> bytes:
    """The whole request body."""
    message = await receive()
    body = message.get("body", b"")
    if not message.get("more_body", False):
        return body
    parts = [body]
    while message.get("more_body", False):
        message = await receive()
        parts.append(message.get("body", b""))
    return b"".join(parts)
