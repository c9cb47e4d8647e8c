"""Loopback ports for the processes we start."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port nobody is listening on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
