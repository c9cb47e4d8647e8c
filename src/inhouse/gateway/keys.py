"""API keys: created once, stored as a peppered SHA-256 hash, checked on every request
(step 1: the live key named by its Authorization header); and who may read what the
gateway knows of its keys and backends (the metrics token).

There is no auth cache: every request looks its key up by hash, so a revoke or an
expiry applies on the very next request on every replica sharing the database.

With `gateway.metrics_token_env` set, `GET /metrics` and `/metrics/targets` (key names,
backend addresses) need `Authorization: Bearer <that token>`, and `GET /health` without it
says only whether each model is up. Without the setting all three are public, as before.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, bindparam, insert, select, update
from starlette.requests import Request
from starlette.responses import Response

from inhouse.api.auth import bearer_token
from inhouse.api.errors import (
    APIError,
    authentication_error,
    invalid_request,
    permission_denied,
)
from inhouse.gateway.config import ConfigError, GatewayConfig
from inhouse.gateway.db import api_keys, sqlite_path
from inhouse.gateway.name_lists import allows, decode, encode
from inhouse.gateway.priority import DEFAULT_CLASS, check_class
from inhouse.http.errors import error_response

KEY_PREFIX = "ih-"
PEPPER_ENV = "INHOUSE_GATEWAY_PEPPER"
# Key names appear in metric labels, audit rows, logs and terminals: plain ASCII only.
KEY_NAME = re.compile(r"[A-Za-z0-9._@-]{1,64}")
KEY_NAME_RULE = "1 to 64 of the characters A-Z a-z 0-9 . _ @ -"


def valid_key_name(name: str) -> bool:
    """Whether `name` may name a new key (see `KEY_NAME_RULE`)."""
    return KEY_NAME.fullmatch(name) is not None


class UnknownKey(LookupError):
    """No key with that name."""


class AuthError(Exception):
    """A request's key is missing, unknown, revoked or expired (all answered with 401)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One key's record; never holds the secret."""

    id: int
    name: str
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    rpm: int | None
    tpm: int | None
    max_concurrent: int | None
    quota_tokens: int | None
    quota_period_s: float | None
    quota_window: int
    quota_used: int
    models: frozenset[str] | None  # public model names it may ask for (None: all)
    adapters: frozenset[str] | None  # LoRA adapters it may ask for (None: all; `adapters`)
    allow_fallback: bool
    log_content: bool
    team: str | None  # whose shared quota and budget it draws on too (`teams`)
    admin: bool  # may use the admin console and its API
    priority: str  # its class: interactive, default or batch (`priority`)
    allow_degrade: bool  # may be answered by a smaller model under overload (`degrade`)
    max_images: int | None  # image parts one request may hold, below the model's (`images`)

    def window_at(self, now: float) -> int:
        """Index of the quota period containing `now` (periods start at key creation)."""
        if not self.quota_period_s:
            return 0
        return int((now - self.created_at) // self.quota_period_s)

    def quota_used_at(self, now: float) -> int:
        """Tokens charged in the current quota period."""
        return self.quota_used if self.quota_window == self.window_at(now) else 0

    def quota_reset_at(self, now: float) -> float | None:
        if not self.quota_period_s:
            return None
        return self.created_at + (self.window_at(now) + 1) * self.quota_period_s

    def state_at(self, now: float) -> str:
        """The key's state at `now` (revoked, expired or active), as the console and
        `keys list` show it."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"

    def may_use(self, model: str) -> bool:
        return allows(self.models, model)

    def may_use_adapter(self, adapter: str) -> bool:
        return allows(self.adapters, adapter)


EDITABLE = frozenset(
    {
        "rpm",
        "tpm",
        "max_concurrent",
        "quota_tokens",
        "quota_period_s",
        "expires_at",
        "models",
        "adapters",
        "allow_fallback",
        "log_content",
        "team",
        "admin",
        "priority",
        "allow_degrade",
        "max_images",
    }
)


class KeyStore:
    """Create, look up, revoke and update keys in the gateway database."""

    def __init__(self, db: Engine, pepper: bytes, clock: Callable[[], float] = time.time):
        self._db = db
        self._pepper = pepper
        self._clock = clock
        # A SQLite lookup by indexed hash takes microseconds: cheaper inline than a
        # thread hop. Network databases are called from a worker thread.
        self.lookup_is_local = db.dialect.name == "sqlite"
        self._salts: dict[int, str] = {}
        self._local = threading.local()
        self._by_hash = select(api_keys).where(api_keys.c.key_hash == bindparam("digest"))

    @property
    def pepper_text(self) -> str:
        """The pepper as text: a secret the audit's redactor must know (never logged)."""
        return self._pepper.decode("utf-8", "replace")

    def hash(self, secret: str) -> str:
        return hmac.digest(self._pepper, secret.encode(), "sha256").hex()

    def cache_salt(self, key: ApiKey) -> str:
        """A per-key salt so tenants never share prefix-cache entries on a backend."""
        salt = self._salts.get(key.id)
        if salt is None:
            message = f"cache-salt:{key.id}".encode()
            salt = self._salts[key.id] = hmac.digest(self._pepper, message, "sha256").hex()
        return salt

    def create(self, name: str, **limits: Any) -> tuple[ApiKey, str]:
        """Store a new key; returns the record and the secret, which is never stored."""
        _check_editable(limits)
        if not valid_key_name(name):
            raise ValueError(f"a key name is {KEY_NAME_RULE}, got {name!r}")
        if self._find(name) is not None:
            raise ValueError(f"a key named {name!r} already exists")
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        values = {**_encode(limits), "name": name, "key_hash": self.hash(secret)}
        values.setdefault("allow_fallback", True)
        values.setdefault("log_content", False)
        with self._db.begin() as conn:
            conn.execute(
                insert(api_keys).values(
                    **values, created_at=self._clock(), quota_window=0, quota_used=0
                )
            )
        return self.get(name), secret

    def authenticate(self, secret: str | None) -> ApiKey:
        """The live key for a presented secret, or AuthError."""
        if not secret:
            raise AuthError("missing")
        digest = self.hash(secret)
        row = self._row_by_hash(digest)
        if row is None or not hmac.compare_digest(row["key_hash"], digest):
            raise AuthError("invalid")
        key = _decode(row)
        now = self._clock()
        if key.revoked_at is not None:
            raise AuthError("revoked")
        if key.expires_at is not None and key.expires_at <= now:
            raise AuthError("expired")
        return key

    def _row_by_hash(self, digest: str) -> dict[str, Any] | None:
        if not self.lookup_is_local:
            with self._db.connect() as conn:
                row = conn.execute(self._by_hash, {"digest": digest}).first()
            return None if row is None else dict(row._mapping)
        # SQLite: a DB-API connection this thread keeps (SQLAlchemy's statement machinery
        # costs ~150 us; a pool checkout and return per lookup ~16 us, more than the
        # ~13 us query). The cursor is closed after its one statement, so no read
        # snapshot outlives it: a revoke is seen at once.
        raw = getattr(self._local, "connection", None)
        if raw is None:
            raw = self._local.connection = self._db.raw_connection()
        cursor = raw.cursor()
        try:
            cursor.execute(_BY_HASH_SQL, (digest,))
            row = cursor.fetchone()
        finally:
            cursor.close()
        return None if row is None else dict(zip(_KEY_COLUMNS, row, strict=True))

    def get(self, name: str) -> ApiKey:
        key = self._find(name)
        if key is None:
            raise UnknownKey(f"no key named {name!r}")
        return key

    def list(self) -> list[ApiKey]:
        with self._db.connect() as conn:
            rows = conn.execute(select(api_keys).order_by(api_keys.c.id)).all()
        return [_decode(r._mapping) for r in rows]

    def revoke(self, name: str) -> ApiKey:
        return self._update(name, {"revoked_at": self._clock()})

    def rotate(self, name: str) -> tuple[ApiKey, str]:
        """Give a key a new secret (the old one is refused from the next request, and the
        key's console sessions end); limits, quota use and history stay. Returns the record
        and the new secret, which is never stored."""
        secret = KEY_PREFIX + secrets.token_urlsafe(32)
        return self._update(name, {"key_hash": self.hash(secret)}), secret

    def by_id(self, key_id: int) -> ApiKey | None:
        with self._db.connect() as conn:
            row = conn.execute(select(api_keys).where(api_keys.c.id == key_id)).first()
        return None if row is None else _decode(row._mapping)

    def update(self, name: str, **changes: Any) -> ApiKey:
        _check_editable(changes)
        return self._update(name, _encode(changes))

    def _find(self, name: str) -> ApiKey | None:
        with self._db.connect() as conn:
            row = conn.execute(select(api_keys).where(api_keys.c.name == name)).first()
        return None if row is None else _decode(row._mapping)

    def _update(self, name: str, values: dict[str, Any]) -> ApiKey:
        with self._db.begin() as conn:
            done = conn.execute(update(api_keys).where(api_keys.c.name == name).values(**values))
        if done.rowcount == 0:
            raise UnknownKey(f"no key named {name!r}")
        return self.get(name)


_FIELDS = tuple(f.name for f in fields(ApiKey))
_KEY_COLUMNS = ("key_hash", *_FIELDS)
_BY_HASH_SQL = f"SELECT {', '.join(_KEY_COLUMNS)} FROM api_keys WHERE key_hash = ?"


def load_pepper(config: GatewayConfig) -> bytes:
    """The server-side pepper: $INHOUSE_GATEWAY_PEPPER, `pepper_file`, or a file beside SQLite."""
    if os.environ.get(PEPPER_ENV):
        return os.environ[PEPPER_ENV].encode()
    path = config.pepper_file
    if path is None:
        db_file = sqlite_path(config.database)
        if db_file is None:
            raise ConfigError(
                f"gateway.pepper_file (or ${PEPPER_ENV}) is required for a non-SQLite database,"
                " and every replica must share it"
            )
        path = db_file.with_name(db_file.name + ".pepper")
    return _read_or_create_pepper(Path(path))


def _read_or_create_pepper(path: Path) -> bytes:
    if path.exists():
        return path.read_bytes().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    pepper = secrets.token_hex(32).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pepper)
    return pepper


def _check_editable(values: dict[str, Any]) -> None:
    unknown = set(values) - EDITABLE
    if unknown:
        raise TypeError(f"not a key setting: {sorted(unknown)}")
    if values.get("priority") is not None:
        check_class(values["priority"])


NAME_LISTS = ("models", "adapters")


def _encode(values: dict[str, Any]) -> dict[str, Any]:
    return {k: encode(v) if k in NAME_LISTS else v for k, v in values.items()}


def _decode(row: Any) -> ApiKey:
    values = {name: row[name] for name in _FIELDS}
    for name in NAME_LISTS:
        values[name] = decode(values[name])
    values["allow_fallback"] = bool(values["allow_fallback"])
    values["log_content"] = bool(values["log_content"])
    values["admin"] = bool(values["admin"])
    values["priority"] = values["priority"] or DEFAULT_CLASS
    values["allow_degrade"] = values["allow_degrade"] is None or bool(values["allow_degrade"])
    return ApiKey(**values)


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


async def authenticate_admin(keys: KeyStore, headers: Sequence[str]) -> ApiKey:
    """The admin key the `Bearer` header presents: as `authenticate`, and 403 for a live key
    that is not an admin's (the admin API, loading and unloading adapters)."""
    key = await authenticate(keys, headers)
    if not key.admin:
        raise permission_denied("This key is not an admin key.", "not_admin")
    return key


def may_scrape(config: GatewayConfig, request: Request) -> bool:
    """Whether `request` may read key names and backend addresses."""
    if config.metrics_token is None:
        return True
    presented = request.headers.getlist("authorization")
    expected = f"Bearer {config.metrics_token}".encode()
    return len(presented) == 1 and hmac.compare_digest(presented[0].encode(), expected)


def scrape_refused() -> Response:
    """401 in OpenAI's shape for a scrape without the metrics token."""
    refused = authentication_error("This route needs the gateway's metrics token.")
    return error_response(refused, {"www-authenticate": "Bearer"})


def public_health(body: dict[str, Any]) -> dict[str, Any]:
    """What `/health` tells anyone: the overall status and each model's, nothing of its
    backends (names, addresses, errors)."""
    models = {name: {"status": model["status"]} for name, model in body["models"].items()}
    return {"status": body["status"], "models": models}
