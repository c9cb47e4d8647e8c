"""The client's side of a relay: a streamed answer that ends the moment its client leaves,
and a watch that ends a non-streamed request's wait for upstream when its client leaves."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

LEAVE_WATCH_AFTER_S = 0.25


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
        on_close: Callable[[], Awaitable[int]],
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
                self.status_code = await self._on_close()

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
