"""Server-sent events in OpenAI's framing: ``data: {json}`` blocks, then ``data: [DONE]``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import anyio
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.types import Message, Receive, Scope, Send

from inhouse.api.errors import APIError, server_error, service_unavailable

log = logging.getLogger(__name__)
DONE = b"data: [DONE]\n\n"


def event(payload: BaseModel) -> bytes:
    """One SSE event carrying ``payload`` (nulls left out, as OpenAI streams do)."""
    return b"data: " + payload.model_dump_json(exclude_none=True).encode() + b"\n\n"


async def _framed(chunks: AsyncIterator[BaseModel]) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            yield event(chunk)
    except APIError as exc:
        yield event(exc.body())
    except Exception:  # the stream has started: report in-band, never hang the client
        log.exception("error while streaming")
        yield event(server_error().body())
    yield DONE


SHUTTING_DOWN = service_unavailable("the server is shutting down; retry on another replica")


class EventStreamResponse(StreamingResponse):
    """A StreamingResponse that, cancelled from outside mid-stream (shutdown past uvicorn's
    graceful timeout), ends with an OpenAI error event and ``[DONE]`` and a clean end of the
    body, instead of a connection cut with no terminal event."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = ended = False

        async def noting(message: Message) -> None:
            nonlocal started, ended
            if message["type"] == "http.response.start":
                started = True
            elif not message.get("more_body", False):
                ended = True
            await send(message)

        try:
            await super().__call__(scope, receive, noting)
        except asyncio.CancelledError:
            if not started or ended:
                raise
            with anyio.CancelScope(shield=True), contextlib.suppress(OSError):
                body = event(SHUTTING_DOWN.body()) + DONE
                await send({"type": "http.response.body", "body": body, "more_body": False})


def sse_response(chunks: AsyncIterator[BaseModel]) -> StreamingResponse:
    """A streaming response of ``chunks`` ending in ``[DONE]``."""
    return EventStreamResponse(
        _framed(chunks),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
