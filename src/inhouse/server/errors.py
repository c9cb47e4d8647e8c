"""Every failure as OpenAI's error body: the exception handlers."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from inhouse.api.errors import APIError, invalid_request, not_found, server_error

log = logging.getLogger(__name__)
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away"; nobody reads it


class ClientDisconnected(Exception):
    """The client closed the connection before its answer was ready."""


def error_response(error: APIError) -> JSONResponse:
    """The JSON response for an :class:`APIError`."""
    return JSONResponse(error.body().model_dump(), status_code=error.status_code)


def validation_error(exc: RequestValidationError) -> APIError:
    """A 400 naming the first offending field in plain words, without pydantic's internals."""
    first = exc.errors()[0] if exc.errors() else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    kind = first.get("type", "")
    if kind == "json_invalid":
        return invalid_request("The request body is not valid JSON.")
    if kind == "missing" and not loc:
        return invalid_request("The request needs a JSON body.")
    message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
    param = ".".join(loc) or None
    if kind == "missing":
        message = f"'{param}' is a required property."
    elif param:
        message = f"Invalid value for '{param}': {message}"
    return invalid_request(message, param=loc[0] if loc else None)


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception type to an OpenAI error body; unknown ones become a logged 500."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            return error_response(not_found(f"Route {request.url.path} not found."))
        if exc.status_code == 405:
            error = APIError(405, f"Method {request.method} is not allowed on {request.url.path}.")
            return error_response(error)
        return error_response(APIError(exc.status_code, str(exc.detail)))

    @app.exception_handler(ClientDisconnected)
    async def _gone(_: Request, __: ClientDisconnected) -> Response:
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return error_response(server_error())
