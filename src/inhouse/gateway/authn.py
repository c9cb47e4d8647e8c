"""Step 1 of a request: the live key named by its Authorization header."""

from __future__ import annotations

import asyncio

from inhouse.api.errors import authentication_error
from inhouse.gateway.keys import ApiKey, AuthError, KeyStore

AUTH_MESSAGES = {
    "missing": "Missing API key: send it as 'Authorization: Bearer <key>'.",
    "invalid": "Incorrect API key provided.",
    "revoked": "This API key has been revoked.",
    "expired": "This API key has expired.",
}


async def authenticate(keys: KeyStore, header: str) -> ApiKey:
    """The key a `Bearer` header presents, or a 401 APIError saying what is wrong with it.

    A store whose lookups stay in memory answers inline; one that may query the
    database runs in a thread, off the event loop."""
    scheme, _, secret = header.partition(" ")
    presented = secret.strip() if scheme.lower() == "bearer" else None
    try:
        if keys.lookup_is_local:
            return keys.authenticate(presented)
        return await asyncio.to_thread(keys.authenticate, presented)
    except AuthError as err:
        raise authentication_error(AUTH_MESSAGES[err.reason]) from None
