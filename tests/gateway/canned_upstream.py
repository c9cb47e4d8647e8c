"""A canned OpenAI-shaped upstream on a real loopback socket (uvicorn in a thread): it answers
every chat completion with the same reply (`reply`, after `delay_s`, or HTTP `fail_status`
when set), streamed or not, and keeps what it was sent. With `json_reply` set, a
`json_schema` request is answered that; with `tool_call` (name, arguments) set, a request
with tools is answered that call (its arguments streamed in two fragments).

Beside that: a chat message "echo: TEXT" is answered TEXT; the upstream model `slow-model`
streams one chunk every `SLOW_CHUNK_S` for a minute; `/v1/completions` answers each prompt
of any shape `n` times, each using all its `max_tokens` (as with `ignore_eos`), and says so
in `usage`; `/tokenize` counts words (prompt "slow" takes `SLOW_TOKENIZE_S`); LoRA adapters
load and unload as vLLM's do (`/v1/load_lora_adapter`: a `lora_path` that is not a folder
is refused 404, a name loaded twice 400), into `adapters`, which `/v1/models` lists with
their `parent` as vLLM does once `lists_models` is set (else it answers 404)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from inhouse.gateway.backends import PROBE_TEXT

USAGE = {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
METRICS = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n"
SLOW_MODEL = "slow-model"
SLOW_CHUNK_S = 0.1
SLOW_TOKENIZE_S = 1.5


@dataclass
class Canned:
    """The upstream's address and the requests it received (headers, JSON body)."""

    url: str
    received: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)
    reply: str = "Hi!"
    delay_s: float = 0.0
    fail_status: int | None = None
    json_reply: str | None = None
    tool_call: tuple[str, str] | None = None
    adapters: set[str] = field(default_factory=set)
    lists_models: bool = False

    def reset(self, reply: str) -> None:
        """Answer `reply` to everything, at once."""
        self.reply, self.delay_s, self.fail_status = reply, 0.0, None
        self.json_reply = self.tool_call = None

    def answer(self, body: dict[str, Any]) -> str | tuple[str, str]:
        """What this request is answered: text, or a tool call (name, arguments)."""
        if body.get("tools") and self.tool_call is not None:
            return self.tool_call
        response_format = body.get("response_format") or {}
        if response_format.get("type") == "json_schema" and self.json_reply is not None:
            return self.json_reply
        return self.reply

    def asked(self) -> list[tuple[dict[str, str], dict[str, Any]]]:
        """What clients sent through the gateway: the received requests less its health
        probes (a real chat each round, `probe_request`'s, to every backend)."""
        return [r for r in self.received if not _is_probe(r[1])]

    def last(self) -> tuple[dict[str, str], dict[str, Any]]:
        """The latest request a client sent (never a health probe)."""
        return self.asked()[-1]


def _is_probe(body: dict[str, Any]) -> bool:
    probe = [{"role": "user", "content": PROBE_TEXT}]
    return body.get("max_tokens") == 1 and body.get("messages") == probe


def _events(model: str, reply: str | tuple[str, str]) -> Iterator[bytes]:
    def chunk(choices: list[Any], **extra: Any) -> bytes:
        body = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": model}
        return b"data: " + json.dumps({**body, "choices": choices, **extra}).encode() + b"\n\n"

    if isinstance(reply, tuple):
        name, arguments = reply
        half = len(arguments) // 2
        call = {"index": 0, "id": "call_0", "type": "function", "function": {"name": name}}
        yield chunk([{"index": 0, "delta": {"role": "assistant", "tool_calls": [call]}}])
        for piece in (arguments[:half], arguments[half:]):
            more = {"index": 0, "function": {"arguments": piece}}
            yield chunk([{"index": 0, "delta": {"tool_calls": [more]}}])
        yield chunk([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}])
    else:
        head, tail = reply[:-1], reply[-1:]
        yield chunk([{"index": 0, "delta": {"role": "assistant", "content": head}}])
        yield chunk([{"index": 0, "delta": {"content": tail}, "finish_reason": "length"}])
    yield chunk([], usage=USAGE)
    yield b"data: [DONE]\n\n"


async def _slow_events(model: str) -> AsyncIterator[bytes]:
    for _ in range(int(60 / SLOW_CHUNK_S)):
        chunk = {"id": "s", "object": "chat.completion.chunk", "created": 0, "model": model,
                 "choices": [{"index": 0, "delta": {"content": "."}}]}  # fmt: skip
        yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
        await asyncio.sleep(SLOW_CHUNK_S)


def _prompts(prompt: Any) -> list[Any]:
    """The prompts of any shape `/v1/completions` takes: text, token ids, or a batch."""
    if isinstance(prompt, str) or all(isinstance(p, int) for p in prompt):
        return [prompt]
    return list(prompt)


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
            model = body["model"]
            slow = model == SLOW_MODEL
            events = _slow_events(model) if slow else _events(model, canned.answer(body))
            return StreamingResponse(events, media_type="text/event-stream")
        said = str(body["messages"][-1].get("content", ""))
        reply = said.removeprefix("echo: ") if said.startswith("echo: ") else canned.answer(body)
        message: dict[str, Any] = {"role": "assistant", "content": reply}
        finish = "length"
        if isinstance(reply, tuple):
            function = {"name": reply[0], "arguments": reply[1]}
            call = {"id": "call_0", "type": "function", "function": function}
            message, finish = (
                {"role": "assistant", "content": None, "tool_calls": [call]},
                "tool_calls",
            )
        choice = {"index": 0, "message": message, "finish_reason": finish}
        answer = {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"]}
        return JSONResponse({**answer, "choices": [choice], "usage": USAGE})

    async def completions(request: Request) -> Response:
        body = await request.json()
        canned.received.append((dict(request.headers), body))
        prompts, n, cap = _prompts(body["prompt"]), body.get("n", 1), body["max_tokens"]
        choices = [
            {"index": i, "text": "x" * cap, "finish_reason": "length"}
            for i in range(len(prompts) * n)
        ]
        sizes = [len(p) if isinstance(p, list) else len(p.split()) for p in prompts]
        usage = {"prompt_tokens": sum(sizes), "completion_tokens": cap * len(choices)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        answer = {"id": "t", "object": "text_completion", "created": 0, "model": body["model"]}
        return JSONResponse({**answer, "choices": choices, "usage": usage})

    async def tokenize(request: Request) -> Response:
        body = await request.json()
        canned.received.append((dict(request.headers), body))
        prompt = str(body.get("prompt", ""))
        if prompt == "slow":
            await asyncio.sleep(SLOW_TOKENIZE_S)
        tokens = list(range(len(prompt.split())))
        return JSONResponse({"count": len(tokens), "max_model_len": 2048, "tokens": tokens})

    async def health(_: Request) -> Response:
        return JSONResponse({})

    async def metrics(_: Request) -> Response:
        return PlainTextResponse(METRICS)

    async def models(_: Request) -> Response:
        if not canned.lists_models:
            return _error(404, "Not Found")
        cards = [{"id": "up-model", "object": "model", "parent": None}]
        cards += [{"id": a, "object": "model", "parent": "up-model"} for a in canned.adapters]
        return JSONResponse({"object": "list", "data": cards})

    async def load_lora(request: Request) -> Response:
        body = await request.json()
        name = body["lora_name"]
        if name in canned.adapters:
            return _error(400, f"The lora adapter '{name}' has already been loaded.")
        if not Path(body.get("lora_path", "")).is_dir():
            return _error(404, f"Loading lora {name} failed: No adapter found")
        canned.adapters.add(name)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora(request: Request) -> Response:
        name = (await request.json())["lora_name"]
        if name not in canned.adapters:
            return _error(404, f"The lora adapter '{name}' cannot be found.")
        canned.adapters.discard(name)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/health", health),
        Route("/metrics", metrics),
        Route("/v1/models", models),
        Route("/v1/load_lora_adapter", load_lora, methods=["POST"]),
        Route("/v1/unload_lora_adapter", unload_lora, methods=["POST"]),
    ]
    return Starlette(routes=routes)


def _error(status: int, message: str) -> Response:
    error = {"message": message, "type": "invalid_request_error", "code": status}
    return JSONResponse({"error": error}, status_code=status)


@contextmanager
def canned_upstream() -> Iterator[Canned]:
    """Serve the canned upstream on 127.0.0.1 for the length of the block."""
    canned = Canned("")
    with serve_in_thread(_app(canned)) as url:
        canned.url = url
        yield canned


@contextmanager
def serve_in_thread(app: Starlette) -> Iterator[str]:
    """Serve `app` with uvicorn on a free 127.0.0.1 port for the length of the block; its URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "the upstream did not start"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
