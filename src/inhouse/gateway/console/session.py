"""Console sign-in: a signed session cookie, CSRF tokens, and a login rate limit.

The cookie holds the admin key's id, an expiry and a nonce, signed with a secret derived
from the gateway's pepper (so every replica sharing the pepper accepts it); it never holds
the key's secret. Every page checks that the key is still live and admin, so revoking the
key ends its sessions at once. Each form carries a CSRF token derived from the session
(or, on the login form, from a pre-login cookie), which a cross-site page cannot read.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from inhouse.gateway.keys import ApiKey, KeyStore
from inhouse.gateway.limits import Gcra

SESSION_COOKIE = "ih_session"
LOGIN_COOKIE = "ih_login"
SESSION_S = 8 * 3600
LOGINS_PER_MINUTE = 10  # per client address


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in admin: its key and the cookie value that proves it."""

    key: ApiKey
    cookie: str


class Sessions:
    """Issues and checks session cookies and CSRF tokens; limits login attempts."""

    def __init__(self, keys: KeyStore, limiter: Gcra, clock: Callable[[], float] = time.time):
        self._keys = keys
        self._secret = bytes.fromhex(keys.hash("inhouse console session signing key"))
        self._limiter = limiter
        self._clock = clock

    def issue(self, key: ApiKey) -> str:
        """A new session cookie value for an admin key."""
        body = f"{key.id}.{int(self._clock()) + SESSION_S}.{secrets.token_urlsafe(12)}"
        return f"{body}.{self._sign(body)}"

    def check(self, cookie: str | None) -> Session | None:
        """The live admin session a cookie proves, or None."""
        if not cookie or cookie.count(".") != 3:
            return None
        body, _, mac = cookie.rpartition(".")
        if not hmac.compare_digest(mac, self._sign(body)):
            return None
        key_id, expires, _nonce = body.split(".")
        if not (key_id.isdigit() and expires.isdigit()) or int(expires) <= self._clock():
            return None
        key = next((k for k in self._keys.list() if k.id == int(key_id)), None)
        if key is None or not key.admin or key.revoked_at is not None:
            return None
        if key.expires_at is not None and key.expires_at <= self._clock():
            return None
        return Session(key, cookie)

    def csrf(self, bound_to: str) -> str:
        """The CSRF token of forms shown with this session (or pre-login) cookie."""
        return self._sign("csrf:" + bound_to)

    def csrf_ok(self, bound_to: str | None, token: str | None) -> bool:
        return bool(bound_to and token) and hmac.compare_digest(self.csrf(bound_to), token)

    def may_try_login(self, client: str) -> tuple[bool, float]:
        """Whether `client` may try another sign-in now, and else in how many seconds."""
        state = self._limiter.acquire(f"console-login:{client}", LOGINS_PER_MINUTE, 1)
        return state.allowed, state.retry_after_s

    def _sign(self, text: str) -> str:
        return hmac.digest(self._secret, text.encode(), "sha256").hex()
