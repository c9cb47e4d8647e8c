"""Step 1 of a request: the live key named by its Authorization header."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from inhouse.api.auth import bearer_token
from inhouse.api.errors import APIError, authentication_error, invalid_request
from inhouse.gateway.keys import ApiKey, AuthError, KeyStore

AUTH_MESSAGES = {
    "missing": "Missing API key: send it as 'Authorization: Bearer <key>'.",
    "invalid": "Incorrect API key provided.",
    "revoked": "This API key has been revoked.",
    "expired": "This API key has expired.",
}


def authorization_values(headers: Sequence[tuple[bytes, bytes]]) -> list[str]:
    """Every Authorization header of an ASGI scope's raw headers, in order."""
    return [value.decode("latin-1") for name, value in headers if name == b"authorization"]


def several_authorizations(count: int) -> APIError:
    """400 for a request with more than one Authorization header: which one a proxy in
    front, the gateway and a backend would each take is not certain, so none is taken."""
    return invalid_request(
        f"the request has {count} Authorization headers: send exactly one",
        code="multiple_authorization_headers",
    )


async def authenticate(keys: KeyStore, headers: Sequence[str]) -> ApiKey:
    """The key the one `Bearer` header of `headers` presents, or an APIError: 400 for several
    headers, 401 saying what is wrong with the key.

    A store whose lookups stay in memory answers inline; one that may query the
    database runs in a thread, off the event loop."""
    if len(headers) > 1:
        raise several_authorizations(len(headers))
    presented = bearer_token(headers[0] if headers else "")
    try:
        if keys.lookup_is_local:
            return keys.authenticate(presented)
        return await asyncio.to_thread(keys.authenticate, presented)
    except AuthError as err:
        raise authentication_error(AUTH_MESSAGES[err.reason]) from None
