"""Text fields bounded before the database: a query string or urlencoded form whose fields
are not UTF-8, or hold a character a database refuses (PostgreSQL takes no NUL in text) or
no person types (other control characters but tab and line ends; lone surrogates), is
answered 400 in OpenAI's shape before any handler reads it.

One check for every field of every request under a path prefix (the gateway's `/admin`:
the console's filters and forms and its usage API), so no filter added later can pass such
a value on to SQL.

Text a client may legitimately send (a prompt, an answer, a model name that names no model:
JSON strings may hold NUL) is stored instead as `storable` writes it: what a database
refuses escaped as JSON escapes it.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_to_bytes

from starlette.types import ASGIApp, Receive, Scope, Send

from inhouse.api.errors import invalid_request
from inhouse.http.body_limit import replaying
from inhouse.http.errors import error_response

_REFUSED = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff]")
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")  # NUL (PostgreSQL); lone surrogates (not UTF-8)


def text_fault(text: str) -> str | None:
    """Why `text` may not reach the database, or None when it may."""
    found = _REFUSED.search(text)
    if found is None:
        return None
    return f"a control character or lone surrogate (U+{ord(found.group()):04X})"


def storable(text: str) -> str:
    """`text` as every database stores it: each NUL or lone surrogate written as its JSON
    escape (``\\u0000``, ``\\ud800``); any other text unchanged."""
    if text.isascii() and "\x00" not in text:
        return text
    return _UNSTORABLE.sub(lambda found: f"\\u{ord(found.group()):04x}", text)


def urlencoded_fault(raw: bytes) -> str | None:
    """Why a urlencoded query string or form may not reach the database (naming the
    field), or None when every name and value of it may."""
    for field in raw.split(b"&"):
        name, _, value = field.partition(b"=")
        for part in (name, value):
            try:
                text = unquote_to_bytes(part.replace(b"+", b" ")).decode("utf-8")
            except UnicodeDecodeError:
                return f"{_label(name)} is not UTF-8"
            fault = text_fault(text)
            if fault is not None:
                return f"{_label(name)} holds {fault}"
    return None


def _label(name: bytes) -> str:
    shown = unquote_to_bytes(name).decode("utf-8", "replace")
    if text_fault(shown) is not None or not shown.isprintable() or len(shown) > 64:
        return "a field"
    return f"field {shown!r}"


class TextFieldGuard:
    """ASGI middleware: under `prefix`, refuse (400, code `invalid_text`) a request whose
    query string or body (read as a urlencoded form) fails `urlencoded_fault`; the body is
    read here and replayed (its size is bounded by `BodySizeLimit` outside)."""

    def __init__(self, app: ASGIApp, prefix: str) -> None:
        self.app = app
        self.prefix = prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (
            path == self.prefix or path.startswith(self.prefix + "/")
        ):
            await self.app(scope, receive, send)
            return
        fault = urlencoded_fault(scope.get("query_string", b""))
        if fault is None and scope["method"] not in ("GET", "HEAD"):
            body, whole = await _read(receive)
            if not whole:
                return  # the client went away
            fault = urlencoded_fault(body)
            receive = replaying(body, receive)
        if fault is not None:
            error = invalid_request(f"the request's {fault}", code="invalid_text")
            await error_response(error)(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def _read(receive: Receive) -> tuple[bytes, bool]:
    """The whole request body, and False when the client disconnected first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"", False
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), True
