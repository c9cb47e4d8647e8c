"""Console sign-in: a server-side session behind a random cookie, CSRF tokens, and a
login rate limit.

The cookie is a random token; the gateway database holds a peppered hash of it (never the
token), the admin key's id, the key's secret hash at sign-in and an expiry, so every replica
sharing the database accepts it, and ending it on one ends it on all. Every page checks
that the session's row is there and unexpired, that the key is still a live admin key, and
that its secret is the one it signed in with: logging out (the row is deleted), revoking or
demoting the key, and rotating its secret each end a session on its next request. Each form
carries a CSRF token derived from the session (or, on the login form, from a pre-login
cookie), which a cross-site page cannot read.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine, delete, insert, literal, select

from inhouse.gateway.db import admin_sessions, api_keys
from inhouse.gateway.keys import ApiKey, KeyStore
from inhouse.gateway.limits import Gcra

SESSION_COOKIE = "ih_session"
LOGIN_COOKIE = "ih_login"
SESSION_S = 8 * 3600
LOGINS_PER_MINUTE = 10  # per client address
TOKEN_CHARS = 43  # secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in admin: its key and the cookie value that proves it."""

    key: ApiKey
    cookie: str


class Sessions:
    """Issues, checks and ends sessions; CSRF tokens; limits login attempts."""

    def __init__(
        self, db: Engine, keys: KeyStore, limiter: Gcra, clock: Callable[[], float] = time.time
    ):  # fmt: skip
        self._db = db
        self._keys = keys
        self._secret = bytes.fromhex(keys.hash("inhouse console session signing key"))
        self._limiter = limiter
        self._clock = clock

    def issue(self, key: ApiKey) -> str:
        """Open a session for an admin key; its cookie value. Expired rows go on the way."""
        token, now = secrets.token_urlsafe(32), self._clock()
        row = select(literal(self._hash(token)), api_keys.c.id, api_keys.c.key_hash,
                     literal(now + SESSION_S)).where(api_keys.c.id == key.id)  # fmt: skip
        with self._db.begin() as conn:
            conn.execute(delete(admin_sessions).where(admin_sessions.c.expires_at <= now))
            conn.execute(insert(admin_sessions).from_select(
                ["token_hash", "key_id", "key_hash", "expires_at"], row))  # fmt: skip
        return token

    def check(self, cookie: str | None) -> Session | None:
        """The live admin session a cookie proves, or None."""
        if not cookie or len(cookie) != TOKEN_CHARS:
            return None
        now = self._clock()
        found = (
            select(api_keys.c.id)
            .join(admin_sessions, admin_sessions.c.key_id == api_keys.c.id)
            .where(
                admin_sessions.c.token_hash == self._hash(cookie),
                admin_sessions.c.expires_at > now,
                admin_sessions.c.key_hash == api_keys.c.key_hash,  # not rotated since
            )
        )
        with self._db.connect() as conn:
            key_id = conn.execute(found).scalar()
        key = None if key_id is None else self._keys.by_id(key_id)
        if key is None or not key.admin or key.revoked_at is not None:
            return None
        if key.expires_at is not None and key.expires_at <= now:
            return None
        return Session(key, cookie)

    def end(self, cookie: str) -> None:
        """Log a session out, on every replica at once."""
        with self._db.begin() as conn:
            conn.execute(
                delete(admin_sessions).where(admin_sessions.c.token_hash == self._hash(cookie))
            )

    def csrf(self, bound_to: str) -> str:
        """The CSRF token of forms shown with this session (or pre-login) cookie."""
        return self._sign("csrf:" + bound_to)

    def csrf_ok(self, bound_to: str | None, token: str | None) -> bool:
        return bool(bound_to and token) and hmac.compare_digest(self.csrf(bound_to), token)

    def may_try_login(self, client: str) -> tuple[bool, float]:
        """Whether `client` may try another sign-in now, and else in how many seconds."""
        state = self._limiter.acquire(f"console-login:{client}", LOGINS_PER_MINUTE, 1)
        return state.allowed, state.retry_after_s

    def _hash(self, token: str) -> str:
        return self._keys.hash("console session:" + token)

    def _sign(self, text: str) -> str:
        return hmac.digest(self._secret, text.encode(), "sha256").hex()
