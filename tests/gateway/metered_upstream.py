"""An upstream that charges what it counts, on a real loopback socket: `/tokenize` and the
chat's `usage.prompt_tokens` give the same count of a chat's messages (one token per two
UTF-8 bytes of content, plus `TEMPLATE` per message: far above the gateway's characters/4
estimate, as a real chat template's markup is), and every reply uses all its `max_tokens`
(as with `ignore_eos`) after `DELAY_S`, so a burst is in flight together. What quota and
budget tests need: every request's real usage is known before it is sent."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from canned_upstream import serve_in_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

MODEL = "metered-model"
TEMPLATE = 8
DELAY_S = 0.5


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """What this upstream counts and charges for a chat's messages."""
    return sum(len(str(m.get("content", "")).encode()) // 2 + TEMPLATE for m in messages)


def _app() -> Starlette:
    async def chat(request: Request) -> Response:
        body = await request.json()
        await asyncio.sleep(DELAY_S)
        prompt, completion = prompt_tokens(body["messages"]), int(body["max_tokens"])
        message = {"role": "assistant", "content": "x" * completion}
        return JSONResponse({
            "id": "m", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "length"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion},
        })  # fmt: skip

    async def tokenize(request: Request) -> Response:
        body = await request.json()
        return JSONResponse({"count": prompt_tokens(body["messages"]), "max_model_len": 4096})

    async def health(_: Request) -> Response:
        return JSONResponse({})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/health", health),
        ]
    )


@contextmanager
def metered_upstream() -> Iterator[str]:
    """Serve the metered upstream for the length of the block; its URL."""
    with serve_in_thread(_app()) as url:
        yield url
