"""A batch flood as its own process: STREAMS streamed chats through a gateway, each asked
again as soon as it ends, until the process is stopped. Kept out of the prober's process so
that the flood's event loop never holds the GIL a probe waits for.

    python tests/flood_client.py URL SECRET MODEL STREAMS
"""

from __future__ import annotations

import asyncio
import sys

import httpx


async def stream_loop(http: httpx.AsyncClient, url: str, body: dict, headers: dict) -> None:
    while True:
        async with http.stream("POST", url, json=body, headers=headers) as answer:
            async for _ in answer.aiter_lines():
                pass


async def flood(gateway: str, secret: str, model: str, streams: int) -> None:
    question = [{"role": "user", "content": "Write a list of numbers."}]
    body = {"model": model, "messages": question, "max_tokens": 16, "stream": True}
    body["ignore_eos"] = True  # vLLM's: every answer 16 tokens
    url, headers = f"{gateway}/v1/chat/completions", {"Authorization": f"Bearer {secret}"}
    limits = httpx.Limits(max_connections=4 * streams)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        await asyncio.gather(*(stream_loop(http, url, body, headers) for _ in range(streams)))


if __name__ == "__main__":
    gateway, secret, model, streams = sys.argv[1:]
    asyncio.run(flood(gateway, secret, model, int(streams)))
