"""Every failure as OpenAI's error body: the shared handlers plus the server's own."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response

from inhouse.api.errors import CLIENT_CLOSED
from inhouse.http.errors import install_error_handlers as install_shared_handlers


class ClientDisconnected(Exception):
    """The client closed the connection before its answer was ready."""


class ModelRefused(Exception):
    """The chat model cannot be served as given (a refused or missing file, a bad config,
    flags it cannot run with): no restart fixes it, so serve says why and exits."""


def install_error_handlers(app: FastAPI) -> None:
    """The shared handlers, and a silent 499 for a client gone."""
    install_shared_handlers(app)

    @app.exception_handler(ClientDisconnected)
    async def _gone(_: Request, __: ClientDisconnected) -> Response:
        return Response(status_code=CLIENT_CLOSED)
