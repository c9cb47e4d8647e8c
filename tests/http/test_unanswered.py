"""The keep-alive client tells a connection that broke before any byte of an answer (the
request may go elsewhere) from one that broke mid-answer. Real sockets on 127.0.0.1."""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest

from inhouse.http.client import ConnectionLost, Http1Client, NotAnswered


async def _server(answer: bytes, reset: bool) -> tuple[asyncio.Server, str]:
    """Reads a request, writes `answer`, then closes (with a TCP reset when `reset`)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        if reset:
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


@pytest.mark.parametrize("reset", [True, False], ids=["reset", "closed"])
def test_a_connection_broken_before_the_answer_is_not_answered(reset: bool) -> None:
    async def run() -> None:
        server, url = await _server(b"", reset)
        async with server:
            client = Http1Client(url, {}, 5.0)
            with pytest.raises(NotAnswered):
                async with client.post("/v1/x", b"{}"):
                    pass

    asyncio.run(run())


def test_a_connection_broken_mid_head_is_lost_not_unanswered() -> None:
    async def run() -> None:
        server, url = await _server(b"HTTP/1.1 200 OK\r\ncontent-", False)
        async with server:
            client = Http1Client(url, {}, 5.0)
            with pytest.raises(ConnectionLost) as raised:
                async with client.post("/v1/x", b"{}"):
                    pass
            assert not isinstance(raised.value, NotAnswered)

    asyncio.run(run())
