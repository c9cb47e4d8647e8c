"""The request-body cap shared by `inhouse serve` and `inhouse gateway`: an ASGI wrapper
that answers OpenAI's 413 ``request_too_large`` once a body passes the limit, declared
(the body is never read) or counted while it arrives."""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inhouse.api.errors import payload_too_large

DEFAULT_MAX_BODY_BYTES = 8 * 2**20  # serve's default body cap for a text model
# The gateway's default, and serve's for a vision model: base64 makes an image a third larger
# (seed 004: a 2 MB photo is 2.7 MB of JSON), so four of them pass 8 MiB; the seed's nginx
# takes 20m.
IMAGE_BODY_BYTES = 20 * 2**20


class BodySizeLimit:
    """ASGI middleware: answer 413 once a request body passes ``max_bytes``."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit():
            if int(declared) > self.max_bytes:
                await self._reject(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        # No trustworthy length (chunked upload): read the body here, then replay it.
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.max_bytes:
                await self._reject(scope, receive, send)
                return
        await self.app(scope, replaying(b"".join(chunks), receive), send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = payload_too_large(self.max_bytes)
        await JSONResponse(error.body().model_dump(), error.status_code)(scope, receive, send)


def replaying(body: bytes, receive: Receive) -> Receive:
    """A receive that gives `body` once (a body already read), then what `receive` gives
    (a disconnect)."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
