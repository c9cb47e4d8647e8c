"""Streaming client: sends one request, timestamps every SSE chunk, reads usage."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from inhouse.api.answers import Chunk, EventSplitter, event_data, read_chunk
from inhouse.api.auth import auth_headers
from inhouse.api.errors import error_message
from inhouse.bench.requests import ENDPOINT_PATHS, BenchRequest, RequestRecord
from inhouse.http.client import Http1Client


def normalize_base_url(url: str) -> str:
    """The server root: `http://h:p/v1/` and `http://h:p` both become `http://h:p`."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


class _StreamState:
    """Folds SSE events into a record; times are taken when bytes arrive, not when parsed."""

    __slots__ = ("done", "events", "record", "sent_at")

    def __init__(self, record: RequestRecord, sent_at: float) -> None:
        self.record = record
        self.sent_at = sent_at
        self.events = EventSplitter()
        self.done = False

    def feed(self, data: bytes, arrived_at: float) -> None:
        """Take the bytes that arrived at `arrived_at`; ValueError if an event is not JSON."""
        for event in self.events.feed(data):
            payload = event_data(event)
            if payload is not None:
                self._chunk(read_chunk(payload), arrived_at - self.sent_at)

    def _chunk(self, chunk: Chunk, at: float) -> None:
        record = self.record
        if chunk.done:
            self.done = True
            return
        if chunk.error_message is not None:
            record.error = f"stream: {chunk.error_message}"
            return
        if chunk.usage is not None:
            record.prompt_tokens = chunk.usage.prompt_tokens
            record.output_tokens = chunk.usage.completion_tokens
            record.token_source = "usage"
        for choice in chunk.choices:
            if choice.produced:
                if record.ttft is None:
                    record.ttft = at
                record.chunk_times.append(at)
                record.output_text += choice.text
            if choice.finish_reason:
                record.finish_reason = choice.finish_reason


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
