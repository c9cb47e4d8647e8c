"""FastAPI dependencies shared by the routes: the app's context and the API key check."""

from __future__ import annotations

import hmac

from fastapi import Request

from inhouse.api.auth import bearer_token
from inhouse.api.errors import authentication_error
from inhouse.server.context import ServerContext


def context(request: Request) -> ServerContext:
    """The app's :class:`ServerContext`."""
    return request.app.state.context


def require_api_key(request: Request) -> None:
    """401 unless ``Authorization: Bearer <key>`` matches ``--api-key`` (when one is set)."""
    expected = context(request).config.api_key
    if expected is None:
        return
    given = bearer_token(request.headers.get("authorization", ""))
    if given is None or not hmac.compare_digest(given, expected):
        raise authentication_error()
