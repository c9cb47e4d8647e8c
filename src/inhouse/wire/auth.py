"""Bearer authentication and reading OpenAI error bodies, for any client of an OpenAI API."""

from __future__ import annotations

import json
from typing import Any


def auth_headers(api_key: str | None) -> dict[str, str]:
    """`Authorization: Bearer …` when a key is given, else no header."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def error_body(message: str, type: str, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`."""
    return {"error": {"message": message, "type": type, "param": None, "code": code}}


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
