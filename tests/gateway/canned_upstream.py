"""A canned OpenAI-shaped upstream on a real loopback socket (uvicorn in a thread): it answers
every chat completion with the same reply (`reply`, after `delay_s`, or HTTP `fail_status`
when set), streamed or not, and keeps what it was sent."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

USAGE = {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
METRICS = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n"


@dataclass
class Canned:
    """The upstream's address and the requests it received (headers, JSON body)."""

    url: str
    received: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)
    reply: str = "Hi!"
    delay_s: float = 0.0
    fail_status: int | None = None

    def last(self) -> tuple[dict[str, str], dict[str, Any]]:
        return self.received[-1]


def _events(model: str, reply: str) -> Iterator[bytes]:
    def chunk(choices: list[Any], **extra: Any) -> bytes:
        body = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": model}
        return b"data: " + json.dumps({**body, "choices": choices, **extra}).encode() + b"\n\n"

    head, tail = reply[:-1], reply[-1:]
    yield chunk([{"index": 0, "delta": {"role": "assistant", "content": head}}])
    yield chunk([{"index": 0, "delta": {"content": tail}, "finish_reason": "length"}])
    yield chunk([], usage=USAGE)
    yield b"data: [DONE]\n\n"


def _app(canned: Canned) -> Starlette:
    async def chat(request: Request) -> Response:
        body = await request.json()
        canned.received.append((dict(request.headers), body))
        if canned.delay_s:
            await asyncio.sleep(canned.delay_s)
        if canned.fail_status is not None:
            error = {"message": "canned failure", "type": "server_error"}
            return JSONResponse({"error": error}, status_code=canned.fail_status)
        if body.get("stream"):
            events = _events(body["model"], canned.reply)
            return StreamingResponse(events, media_type="text/event-stream")
        message = {"role": "assistant", "content": canned.reply}
        choice = {"index": 0, "message": message, "finish_reason": "length"}
        answer = {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"]}
        return JSONResponse({**answer, "choices": [choice], "usage": USAGE})

    async def health(_: Request) -> Response:
        return JSONResponse({})

    async def metrics(_: Request) -> Response:
        return PlainTextResponse(METRICS)

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/health", health),
        Route("/metrics", metrics),
    ]
    return Starlette(routes=routes)


@contextmanager
def canned_upstream() -> Iterator[Canned]:
    """Serve the canned upstream on 127.0.0.1 for the length of the block."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    canned = Canned(f"http://127.0.0.1:{sock.getsockname()[1]}")
    server = uvicorn.Server(uvicorn.Config(_app(canned), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "the canned upstream did not start"
    try:
        yield canned
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
