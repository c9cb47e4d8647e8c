"""OpenAI's error body and the exception that carries it to the HTTP layer.

Every failure a client can see has the shape
``{"error": {"message": str, "type": str, "param": str | None, "code": str | None}}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from inhouse.api.field_errors import describe

CLIENT_CLOSED = 499  # nginx's "client closed request": the client left before its answer


def error_body(
    message: str, type: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """OpenAI's error body as JSON data: `{"error": {"message", "type", "param", "code"}}`."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_message(body: bytes) -> str:
    """The `error.message` of an OpenAI error body (or FastAPI's `detail`), else the start
    of whatever came back."""
    try:
        payload = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace").strip()
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    if isinstance(payload, dict) and payload.get("detail"):
        return str(payload["detail"])
    return body[:200].decode("utf-8", "replace").strip()


class ErrorDetail(BaseModel):
    """The inner object of an OpenAI error body."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body: ``{"error": {...}}``."""

    error: ErrorDetail


class APIError(Exception):
    """An error meant for the client: an HTTP status plus OpenAI's error body."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> ErrorResponse:
        """The error as OpenAI's JSON body."""
        body = error_body(self.message, self.type, self.code, self.param)
        return ErrorResponse.model_validate(body)


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """400: the request is well-formed JSON but asks for something we cannot do."""
    return APIError(400, message, param=param, code=code)


def invalid_fields(errors: Sequence[Mapping[str, Any]]) -> APIError:
    """A 400 naming the first field pydantic refused, in plain words without its internals
    (``errors`` as ``ValidationError.errors()`` gives them)."""
    message, param = describe(errors)
    return invalid_request(message, param=param)


def authentication_error(message: str = "Incorrect API key provided.") -> APIError:
    """401: missing or wrong key."""
    return APIError(401, message, type="authentication_error", code="invalid_api_key")


def permission_denied(message: str, code: str, param: str | None = None) -> APIError:
    """403: the key is good but may not do this."""
    return APIError(403, message, type="permission_error", param=param, code=code)


def not_found(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """404: unknown model or route."""
    return APIError(404, message, type="invalid_request_error", param=param, code=code)


def payload_too_large(limit_bytes: int) -> APIError:
    """413: the body is over the server's size limit."""
    return APIError(
        413,
        f"Request body is larger than the limit of {limit_bytes} bytes.",
        code="request_too_large",
    )


def service_unavailable(message: str) -> APIError:
    """503: the server cannot answer now (loading, overloaded, shutting down)."""
    return APIError(503, message, type="service_unavailable", code="service_unavailable")


def server_error(message: str = "The server had an error processing your request.") -> APIError:
    """500: our fault, never the client's input."""
    return APIError(500, message, type="server_error", code="internal_error")
