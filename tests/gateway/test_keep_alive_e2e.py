"""The gateway keeps an idle client connection open longer than common clients' pools keep
it (issue 43). When both sides give up on an idle connection after the same 5 s (uvicorn's
default and httpx's, the openai SDK's), the client can send its next request just as the
server closes: the request fails before any answer, and no client retries a POST. A real
gateway process before the canned upstream (`gateway_under_test`).
"""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator

import pytest
from canned_upstream import Canned
from gateway_under_test import Gateway, start_gateway

from inhouse.gateway.config_values import KEEP_ALIVE_S

pytestmark = pytest.mark.slow

CLIENT_POOL_IDLE_S = 5.0  # httpx's keepalive_expiry, the openai SDK's too
IDLE_S = CLIENT_POOL_IDLE_S + 1.0


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, canned: Canned) -> Iterator[Gateway]:
    running = start_gateway(tmp_path_factory.mktemp("gateway"), canned)
    try:
        yield running
    finally:
        running.process.stop()


def test_an_idle_connection_outlives_the_clients_pool(gateway: Gateway) -> None:
    """A connection idle past a 5 s client pool still answers the next request: the client
    is the side that closes first."""
    assert KEEP_ALIVE_S > IDLE_S
    host, port = gateway.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", "/health")
        first = connection.getresponse()
        first.read()
        sock = connection.sock
        time.sleep(IDLE_S)
        connection.request("GET", "/health")  # raises RemoteDisconnected when it was closed
        second = connection.getresponse()
        second.read()
        assert (first.status, second.status) == (200, 200)
        assert connection.sock is sock  # the same connection, not a new one
    finally:
        connection.close()
