"""Loopback ports for the processes we start."""

from __future__ import annotations

import socket
from collections.abc import Collection


def free_port(avoid: Collection[int] = ()) -> int:
    """A loopback port nobody is listening on right now, and none of `avoid`: ports already
    promised to a process that has not bound them yet (the kernel may hand one out again)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in avoid:
            return port
