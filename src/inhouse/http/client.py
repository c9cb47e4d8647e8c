"""A lean HTTP/1.1 client: one write per request, keep-alive, chunked decoding on asyncio streams.
A general client (httpx) spends much of its CPU per streamed chunk on its protocol machinery;
this one a fraction of that. bench sends its measured requests with it (so the client stays far from
being the bottleneck, see benchmarks/bench_client_overhead.py) and the gateway its upstream
requests. Setup, scraping and health checks keep using httpx."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import AsyncIterator
from urllib.parse import urlsplit


class ConnectionLost(ConnectionError):
    """The server closed or broke the connection before the response was complete."""


class NotAnswered(ConnectionLost):
    """The connection broke (reset, or closed) before any byte of the response: the server
    never answered, so the request may go to another server, as a refused connection's."""


class _Connection:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        self.writer.close()


class Response:
    """Status, lower-cased headers and the body, read once as it arrives."""

    def __init__(self, connection: _Connection, status: int, headers: dict[str, str]) -> None:
        self.status = status
        self.headers = headers
        self._connection = connection
        self.complete = False

    async def iter_body(self) -> AsyncIterator[bytes]:
        """Body pieces as they arrive (a chunked body yields one piece per HTTP chunk)."""
        reader = self._connection.reader
        try:
            if self.headers.get("transfer-encoding", "").lower() == "chunked":
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
                    if size == 0:
                        while await reader.readuntil(b"\r\n") != b"\r\n":
                            pass
                        break
                    data = await reader.readexactly(size + 2)
                    yield data[:-2]
            elif "content-length" in self.headers:
                remaining = int(self.headers["content-length"])
                while remaining:
                    data = await reader.read(min(remaining, 65536))
                    if not data:
                        raise ConnectionLost("the body ended early")
                    remaining -= len(data)
                    yield data
            else:
                while data := await reader.read(65536):
                    yield data
                self.headers["connection"] = "close"
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise ConnectionLost("the response ended early") from exc
        self.complete = True

    async def read(self) -> bytes:
        """The whole body."""
        return b"".join([piece async for piece in self.iter_body()])


class Http1Client:
    """POSTs JSON to one origin over a pool of keep-alive connections; no proxies, no HTTP/2."""

    def __init__(self, base_url: str, headers: dict[str, str], connect_timeout: float) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{base_url!r} is not an http(s) URL")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._prefix = parts.path.rstrip("/")
        fields = {"host": parts.netloc, "content-type": "application/json", **headers}
        self._head = "".join(f"{name}: {value}\r\n" for name, value in fields.items())
        self._connect_timeout = connect_timeout
        self._idle: list[_Connection] = []

    async def _connect(self) -> _Connection:
        async with asyncio.timeout(self._connect_timeout):
            reader, writer = await asyncio.open_connection(
                self._host, self._port, ssl=self._ssl, limit=1 << 20
            )
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Connection(reader, writer)

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if not connection.reader.at_eof():
                return connection
            connection.close()
        return None

    async def _exchange(self, connection: _Connection, request: bytes) -> Response:
        connection.writer.write(request)
        await connection.writer.drain()
        head = await connection.reader.readuntil(b"\r\n\r\n")
        status_line, *lines = head[:-4].decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return Response(connection, int(status_line.split(" ", 2)[1]), headers)

    @contextlib.asynccontextmanager
    async def post(self, path: str, body: bytes) -> AsyncIterator[Response]:
        """Send a POST and yield its response; a stale kept-alive connection is retried once
        on a new one, and a connection that breaks before the response began raises
        `NotAnswered`."""
        request = (
            f"POST {self._prefix}{path} HTTP/1.1\r\n{self._head}content-length: {len(body)}\r\n\r\n"
        ).encode("latin-1") + body
        connection = self._take_idle()
        try:
            if connection is not None:
                try:
                    response = await self._exchange(connection, request)
                except (asyncio.IncompleteReadError, ConnectionError):
                    connection.close()
                    connection = None
            if connection is None:
                connection = await self._connect()
                response = await self._exchange(connection, request)
        except asyncio.IncompleteReadError as exc:
            if connection is not None:
                connection.close()
            if not exc.partial:
                raise NotAnswered("the server closed the connection unanswered") from exc
            raise ConnectionLost("the server closed the connection") from exc
        except (ConnectionResetError, BrokenPipeError) as exc:  # no byte of a head came
            if connection is not None:
                connection.close()
            raise NotAnswered(f"the connection broke unanswered: {exc!r}") from exc
        except BaseException:
            if connection is not None:
                connection.close()
            raise
        try:
            yield response
        finally:
            if response.complete and response.headers.get("connection") != "close":
                self._idle.append(connection)
            else:
                connection.close()

    async def aclose(self) -> None:
        """Close every idle connection."""
        for connection in self._idle:
            connection.close()
        self._idle.clear()
