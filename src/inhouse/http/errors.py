"""OpenAI's error body on every path of a FastAPI app, shared by `inhouse serve` and the
gateway: API errors, refused fields, unknown routes (404), wrong methods (405), bodies
that are not JSON, and anything unexpected (a logged 500)."""

from __future__ import annotations

import logging
import math
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from inhouse.api.errors import APIError, invalid_fields, not_found, server_error

log = logging.getLogger(__name__)
_SURROGATE = re.compile("[\ud800-\udfff]")


def error_response(
    error: APIError, headers: dict[str, str] | None = None, retry_after: float | None = None
) -> JSONResponse:
    """The JSON response for an :class:`APIError`, with `Retry-After` (seconds, and
    `retry-after-ms`) when `retry_after` is known."""
    out = dict(headers or {})
    if retry_after is not None and math.isfinite(retry_after):
        out["retry-after"] = str(max(1, math.ceil(retry_after)))
        out["retry-after-ms"] = str(max(1, math.ceil(retry_after * 1000)))
    body = error.body().model_dump()
    body["error"]["message"] = utf8_text(body["error"]["message"])  # it may repeat the client's
    return JSONResponse(body, status_code=error.status_code, headers=out)


def utf8_text(text: str) -> str:
    """`text` as UTF-8 can hold it: a lone surrogate (JSON's "\\ud800" decodes to one) is
    replaced by U+FFFD."""
    return text if text.isascii() else _SURROGATE.sub("\ufffd", text)


def method_not_allowed(method: str, path: str) -> APIError:
    """405 in OpenAI's shape."""
    return APIError(405, f"Method {method} is not allowed on {path}.", code="method_not_allowed")


def http_error(request: Request, exc: StarletteHTTPException) -> APIError:
    """Starlette's own HTTP errors (no route, wrong method, unreadable body) as API errors."""
    if exc.status_code == 404:
        return not_found(f"Route {request.url.path} not found.", code="route_not_found")
    if exc.status_code == 405:
        return method_not_allowed(request.method, request.url.path)
    return APIError(exc.status_code, str(exc.detail))


def install_error_handlers(app: FastAPI) -> None:
    """Route every exception type to an OpenAI error body; unknown ones become a logged 500."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(invalid_fields(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        allow = (exc.headers or {}).get("allow")
        return error_response(http_error(request, exc), {"allow": allow} if allow else None)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return error_response(server_error())
