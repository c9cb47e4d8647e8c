"""Server-sent events in OpenAI's framing: ``data: {json}`` blocks, then ``data: [DONE]``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from inhouse.api.errors import APIError, server_error

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


def sse_response(chunks: AsyncIterator[BaseModel]) -> StreamingResponse:
    """A streaming response of ``chunks`` ending in ``[DONE]``."""
    return StreamingResponse(
        _framed(chunks),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
