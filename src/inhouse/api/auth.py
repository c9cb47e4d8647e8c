"""Bearer authentication on both sides of an OpenAI API: the header a client sends and the
key a server reads from it."""

from __future__ import annotations


def auth_headers(api_key: str | None) -> dict[str, str]:
    """`Authorization: Bearer …` when a key is given, else no header."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def bearer_token(header: str) -> str | None:
    """The key an `Authorization` header value presents (`Bearer <key>`, the scheme in any
    case), or None when it does not use the Bearer scheme."""
    scheme, _, secret = header.partition(" ")
    return secret.strip() if scheme.lower() == "bearer" else None
