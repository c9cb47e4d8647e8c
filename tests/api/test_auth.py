"""Bearer headers both ways and OpenAI error bodies built and read."""

from __future__ import annotations

import pytest

from inhouse.api.auth import auth_headers, bearer_token
from inhouse.api.errors import APIError, error_body, error_message


def test_auth_and_error_bodies() -> None:
    assert auth_headers("k") == {"Authorization": "Bearer k"} and auth_headers(None) == {}
    body = error_body("no", "server_error", "x")
    assert body == {"error": {"message": "no", "type": "server_error", "param": None, "code": "x"}}
    assert error_message(b'{"error": {"message": "no"}}') == "no"
    assert error_message(b'{"detail": "gone"}') == "gone"
    assert error_message(b"<h1>Bad Gateway</h1>") == "<h1>Bad Gateway</h1>"


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer k", "k"),
        ("bearer  k ", "k"),
        ("BEARER k", "k"),
        ("Basic k", None),
        ("k", None),
        ("", None),
    ],
)
def test_bearer_token_is_read_from_the_bearer_scheme_only(header: str, token: str | None) -> None:
    assert bearer_token(header) == token


def test_api_errors_carry_the_same_body_as_error_body() -> None:
    error = APIError(400, "bad", param="temperature", code="c")
    assert error.body().model_dump() == error_body(
        "bad", "invalid_request_error", "c", "temperature"
    )
