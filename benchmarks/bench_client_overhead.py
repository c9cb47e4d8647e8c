"""How much does `inhouse bench`'s own client cost? Measured against a trivial local SSE server.

The server (a separate process, raw asyncio, no framework) answers every POST with a stream of
OpenAI-shaped chunks, a usage chunk and `data: [DONE]`. Two measurements, both against a
baseline taken in this same run:

1. flood: chunks as fast as the server writes them. Client CPU seconds per chunk for
   `StreamingClient` versus a bare asyncio-socket reader that only scans for the end of the
   stream (the least any client can do). Also the chunk rate the client sustains.
2. paced: the server sleeps a fixed gap between chunks; the ITL the client measures is
   compared with that true gap (p50/p99 error), at several concurrencies.

Run: .venv/bin/python benchmarks/bench_client_overhead.py
"""

from __future__ import annotations

import asyncio
import itertools
import json
import multiprocessing
import socket
import statistics
import time

from inhouse.bench.client import StreamingClient
from inhouse.bench.loadgen import LoadShape, generate_load
from inhouse.bench.metrics import percentile
from inhouse.bench.requests import BenchRequest

CHUNKS = 128


def _chunk(text: str) -> bytes:
    event = {
        "id": "x",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def _http_chunk(payload: bytes) -> bytes:
    return f"{len(payload):x}\r\n".encode() + payload + b"\r\n"


async def _serve_connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gap: float
) -> None:
    token = _http_chunk(_chunk(" word"))
    usage = {
        "choices": [],
        "usage": {"prompt_tokens": 8, "completion_tokens": CHUNKS, "total_tokens": 8 + CHUNKS},
    }
    tail = _http_chunk(b"data: " + json.dumps(usage).encode() + b"\n\n")
    tail += _http_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    while True:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            ),
            0,
        )
        await reader.readexactly(length)
        if head.startswith(b"GET"):
            body = b'{"object":"list","data":[{"id":"m","object":"model"}]}'
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            continue
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        for _ in range(CHUNKS):
            writer.write(token)
            if gap:
                await writer.drain()
                await asyncio.sleep(gap)
        writer.write(tail)
        await writer.drain()


def _server_main(sock: socket.socket, gap: float) -> None:
    async def main() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            # asyncio sets TCP_NODELAY only when the listening socket's proto is IPPROTO_TCP;
            # socket.socket() leaves it 0, and Nagle would then hold small chunks ~40 ms.
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                await _serve_connection(reader, writer, gap)
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()

        server = await asyncio.start_server(handle, sock=sock)
        await server.serve_forever()

    asyncio.run(main())


class SseServer:
    """The trivial SSE server in its own process, on a free loopback port."""

    def __init__(self, gap: float) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(512)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        context = multiprocessing.get_context("fork")
        self._process = context.Process(target=_server_main, args=(self._sock, gap), daemon=True)

    def __enter__(self) -> SseServer:
        self._process.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._process.terminate()
        self._process.join()
        self._sock.close()


async def _bare_request(port: int) -> list[float]:
    """One request over a fresh socket; arrival times of its content events (one read may
    carry several, which then arrive together)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
    arrivals: list[float] = []
    tail = b""
    while not tail.endswith(b"0\r\n\r\n"):
        data = await reader.read(65536)
        now = time.perf_counter()
        arrivals.extend([now] * data.count(b'"content"'))
        tail = (tail + data)[-16:]
    writer.close()
    return arrivals


async def _bare(url: str, requests: int, concurrency: int) -> tuple[float, list[float]]:
    port = int(url.rsplit(":", 1)[1])
    queue = list(range(requests))
    gaps: list[float] = []

    async def worker() -> None:
        while queue:
            queue.pop()
            arrivals = await _bare_request(port)
            gaps.extend(b - a for a, b in itertools.pairwise(arrivals))

    cpu = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.process_time() - cpu, gaps


def _requests(count: int) -> list[BenchRequest]:
    message = ({"role": "user", "content": "hi"},)
    return [BenchRequest(index=i, max_tokens=CHUNKS, messages=message) for i in range(count)]


async def _ours(url: str, requests: int, concurrency: int) -> tuple[float, float, list[float]]:
    async with StreamingClient(url, "m") as client:
        shape = LoadShape(max_concurrency=concurrency, num_prompts=requests)
        cpu = time.process_time()
        result = await generate_load(_requests(requests), client.send, shape)
        cpu = time.process_time() - cpu
    assert all(r.ok and r.output_tokens == CHUNKS for r in result.records), result.records[0]
    gaps = [gap for r in result.records for gap in r.itl]
    return cpu, result.duration, gaps


def flood(requests: int = 200, concurrency: int = 16) -> None:
    with SseServer(gap=0.0) as server:
        time.sleep(0.3)
        asyncio.run(_bare(server.url, 10, 2))
        bare_cpu, _ = asyncio.run(_bare(server.url, requests, concurrency))
        ours_cpu, wall, _ = asyncio.run(_ours(server.url, requests, concurrency))
    chunks = requests * CHUNKS
    print(f"flood: {requests} requests x {CHUNKS} chunks at concurrency {concurrency}")
    print(f"  bare socket reader : {bare_cpu / chunks * 1e6:7.1f} us CPU per chunk (baseline)")
    print(
        f"  StreamingClient    : {ours_cpu / chunks * 1e6:7.1f} us CPU per chunk "
        f"= {ours_cpu / bare_cpu:.1f}x baseline; sustained {chunks / wall:,.0f} chunks/s"
    )


def _errors(gaps: list[float], gap_ms: float) -> str:
    errors = [g * 1000 - gap_ms for g in gaps]
    return f"p50 {statistics.median(errors):+6.2f} ms, p99 {percentile(errors, 99):+6.2f} ms"


def paced(gap_ms: float = 20.0, requests_per_slot: int = 4) -> None:
    print(f"paced: server sleeps {gap_ms:g} ms between chunks; ITL error = measured - true")
    with SseServer(gap=gap_ms / 1000) as server:
        time.sleep(0.3)
        for concurrency in (1, 16, 64):
            requests = requests_per_slot * concurrency
            _, bare_gaps = asyncio.run(_bare(server.url, requests, concurrency))
            _, _, gaps = asyncio.run(_ours(server.url, requests, concurrency))
            baseline = _errors(bare_gaps, gap_ms)
            print(
                f"  concurrency {concurrency:3d}: bare reader (baseline) {baseline}"
                f" | StreamingClient {_errors(gaps, gap_ms)}"
            )


if __name__ == "__main__":
    flood()
    paced()
