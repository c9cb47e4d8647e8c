"""Streaming client: sends one request, timestamps every SSE chunk, reads usage."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from inhouse.bench.requests import ENDPOINT_PATHS, BenchRequest, RequestRecord
from inhouse.http1 import Http1Client


def normalize_base_url(url: str) -> str:
    """The server root: `http://h:p/v1/` and `http://h:p` both become `http://h:p`."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


def auth_headers(api_key: str | None) -> dict[str, str]:
    """`Authorization: Bearer …` when a key is given."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def error_message(body: bytes) -> str:
    """The `error.message` of an OpenAI error body, or the start of whatever came back."""
    try:
        payload = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace").strip()
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    if isinstance(payload, dict) and payload.get("detail"):
        return str(payload["detail"])
    return body[:200].decode("utf-8", "replace").strip()


class _StreamState:
    """Folds SSE events into a record; times are taken when bytes arrive, not when parsed."""

    __slots__ = ("buffer", "done", "record", "sent_at")

    def __init__(self, record: RequestRecord, sent_at: float) -> None:
        self.record = record
        self.sent_at = sent_at
        self.buffer = b""
        self.done = False

    def feed(self, data: bytes, arrived_at: float) -> None:
        lines = (self.buffer + data).split(b"\n")
        self.buffer = lines.pop()
        for line in lines:
            if line.startswith(b"data:"):
                self._event(line[5:].strip(), arrived_at - self.sent_at)

    def _event(self, payload: bytes, at: float) -> None:
        if payload == b"[DONE]":
            self.done = True
            return
        event = json.loads(payload)
        record = self.record
        if event.get("error"):
            error = event["error"]
            message = error.get("message") if isinstance(error, dict) else error
            record.error = f"stream: {message}"
            return
        usage = event.get("usage")
        if usage:
            record.prompt_tokens = usage.get("prompt_tokens")
            record.output_tokens = usage.get("completion_tokens")
            record.token_source = "usage"
        for choice in event.get("choices") or ():
            text = _choice_text(choice)
            if text:
                if record.ttft is None:
                    record.ttft = at
                record.chunk_times.append(at)
                record.output_text += text
            if choice.get("finish_reason"):
                record.finish_reason = choice["finish_reason"]


def _choice_text(choice: dict[str, Any]) -> str:
    delta = choice.get("delta")
    if delta is None:
        return choice.get("text") or ""
    content = delta.get("content") or delta.get("reasoning_content") or ""
    if not content and delta.get("tool_calls"):
        return json.dumps(delta["tool_calls"])
    return content


class StreamingClient:
    """Sends benchmark requests to an OpenAI-compatible server over pooled keep-alive
    connections, timestamping every chunk as its bytes arrive."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        timeout: float = 600.0,
        sampling: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.timeout = timeout
        self.sampling = dict(sampling or {})
        self._http = Http1Client(
            normalize_base_url(base_url),
            {"accept": "text/event-stream", **auth_headers(api_key)},
            connect_timeout=min(timeout, 10.0),
        )

    async def __aenter__(self) -> StreamingClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the idle connections."""
        await self._http.aclose()

    def body(self, request: BenchRequest) -> dict[str, Any]:
        """The JSON body: streaming on, usage forced on, sampling options added."""
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self.sampling,
        }
        if request.messages is not None:
            body["messages"] = list(request.messages)
        else:
            body["prompt"] = request.prompt
        return body

    async def send(self, request: BenchRequest, clock_zero: float) -> RequestRecord:
        """Run one request to completion or failure; never raises for server or network faults.

        `start` is seconds since `clock_zero`; TTFT, E2E and chunk times are seconds since start.
        """
        payload = json.dumps(self.body(request)).encode()
        path = ENDPOINT_PATHS[request.endpoint]
        sent_at = time.perf_counter()
        record = RequestRecord(
            index=request.index,
            start=sent_at - clock_zero,
            intended_input_tokens=request.intended_input_tokens,
        )
        state = _StreamState(record, sent_at)
        last_byte = sent_at
        try:
            async with asyncio.timeout(self.timeout), self._http.post(path, payload) as response:
                record.status = response.status
                if response.status != 200:
                    record.error = f"http: {error_message(await response.read())}"
                else:
                    async for data in response.iter_body():
                        last_byte = time.perf_counter()
                        state.feed(data, last_byte)
                last_byte = time.perf_counter()
        except TimeoutError:
            record.error = f"timeout: no complete answer within {self.timeout:g} s"
        except OSError as exc:
            record.error = f"connection: {type(exc).__name__}: {exc}"
        except ValueError as exc:
            record.error = f"stream: unreadable response ({exc})"
        if record.error is not None:
            last_byte = time.perf_counter()  # a failed request's E2E lasts until it failed
        record.e2e = last_byte - sent_at
        if record.ok and not state.done:
            record.error = "stream: ended before data: [DONE]"
        return record
