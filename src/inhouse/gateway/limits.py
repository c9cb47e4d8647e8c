"""Per-key limits: concurrency, token quota, requests/minute and tokens/minute.

Tokens are reserved at admission (prompt estimate + max_tokens, as OpenAI counts)
and reconciled with the backend's usage when the response ends. Requests/minute
and tokens/minute use GCRA; concurrency is counted in this process; the token
quota is held in the key database with the team's (`holds`), and
`quota_exceeded` words its refusal.

GCRA (generic cell rate algorithm) is a smooth rate limit with one number of state.
A bucket allows `limit` units per `period`, in bursts of up to `limit`. Its state is
the theoretical arrival time (TAT): when the bucket would be empty again. A cost of
n moves TAT forward by n·period/limit; a request passes if the new TAT is no more
than one period ahead of now. Stores update TAT by compare-and-set, so the same
code runs on a dict (one process) or a table row per bucket (all replicas).
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from sqlalchemy import Engine, insert, select, update
from sqlalchemy.exc import IntegrityError

from inhouse.api.errors import APIError
from inhouse.gateway.db import limiter_state
from inhouse.gateway.durations import format_reset
from inhouse.gateway.keys import ApiKey

_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class RateState:
    """A bucket after a decision: what the `x-ratelimit-*` headers report."""

    allowed: bool
    limit: int
    remaining: int
    reset_s: float
    retry_after_s: float


class TatStore(Protocol):
    """Where TATs live; `compare_and_set` must be atomic."""

    def get(self, bucket: str) -> float | None: ...

    def compare_and_set(self, bucket: str, expected: float | None, new: float) -> bool: ...


class MemoryTatStore:
    """TATs in this process: limits hold per gateway replica."""

    def __init__(self) -> None:
        self._tats: dict[str, float] = {}
        self._lock = threading.Lock()

    def get(self, bucket: str) -> float | None:
        return self._tats.get(bucket)

    def compare_and_set(self, bucket: str, expected: float | None, new: float) -> bool:
        with self._lock:
            if self._tats.get(bucket) != expected:
                return False
            self._tats[bucket] = new
            return True


class SqlTatStore:
    """TATs in the shared database, one row per bucket: limits hold across replicas."""

    def __init__(self, db: Engine) -> None:
        self._db = db

    def get(self, bucket: str) -> float | None:
        with self._db.connect() as conn:
            return conn.execute(
                select(limiter_state.c.tat).where(limiter_state.c.bucket == bucket)
            ).scalar()

    def compare_and_set(self, bucket: str, expected: float | None, new: float) -> bool:
        try:
            with self._db.begin() as conn:
                if expected is None:
                    conn.execute(insert(limiter_state).values(bucket=bucket, tat=new))
                    return True
                done = conn.execute(
                    update(limiter_state)
                    .where(limiter_state.c.bucket == bucket, limiter_state.c.tat == expected)
                    .values(tat=new)
                )
                return done.rowcount == 1
        except IntegrityError:
            return False


class Gcra:
    """Rate decisions over a TatStore with an injected clock."""

    def __init__(self, store: TatStore, clock: Callable[[], float], period_s: float = 60.0):
        self._store = store
        self._clock = clock
        self._period = period_s

    def acquire(self, bucket: str, limit: int, cost: int) -> RateState:
        """Take `cost` units if they fit now; the state says when they would otherwise."""
        interval = self._period / limit
        while True:
            now = self._clock()
            stored = self._store.get(bucket)
            tat = now if stored is None else max(stored, now)
            new = tat + cost * interval
            if new - now > self._period + _EPSILON:
                never = cost * interval > self._period + _EPSILON
                wait = math.inf if never else new - self._period - now
                return self._state(False, limit, interval, tat - now, wait)
            if self._store.compare_and_set(bucket, stored, new):
                return self._state(True, limit, interval, new - now, 0.0)

    def peek(self, bucket: str, limit: int) -> RateState:
        """The bucket's state without taking anything."""
        interval = self._period / limit
        stored = self._store.get(bucket)
        now = self._clock()
        ahead = 0.0 if stored is None else max(stored - now, 0.0)
        return self._state(True, limit, interval, ahead, 0.0)

    def adjust(self, bucket: str, limit: int, cost: int) -> None:
        """Charge (cost > 0) or refund (cost < 0) units after the fact; refunds stop at now."""
        if cost == 0:
            return
        interval = self._period / limit
        while True:
            now = self._clock()
            stored = self._store.get(bucket)
            tat = now if stored is None else max(stored, now)
            new = max(tat + cost * interval, now)
            if self._store.compare_and_set(bucket, stored, new):
                return

    def _state(
        self, allowed: bool, limit: int, interval: float, ahead: float, wait: float
    ) -> RateState:
        remaining = max(0, math.floor((self._period - ahead) / interval + 1e-6))
        return RateState(allowed, limit, min(remaining, limit), ahead, wait)


CONCURRENCY_RETRY_S = 1.0
# Clients (the official `openai` ones among them) retry a 429 after at most about a minute:
# a refusal that no retry within it can pass says so with `x-should-retry: false`.
CLIENT_RETRY_HORIZON_S = 60.0
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Admission:
    """The limiter's answer: allowed or why not, with the headers to send either way."""

    allowed: bool
    reason: str | None = None
    retry_after_s: float | None = None
    message: str = ""
    headers: dict[str, str] = field(default_factory=dict)


class LimitCalls:
    """Runs a limiter call inline, or in a thread when the limits live in the database
    (`shared_limits`) so that its queries never block the event loop."""

    def __init__(self, blocking: bool) -> None:
        self.blocking = blocking

    async def __call__(self, fn: Callable[..., T], *args: Any) -> T:
        if self.blocking:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)


class KeyLimiter:
    """Admits and settles requests against one key's limits."""

    def __init__(self, gcra: Gcra) -> None:
        self._gcra = gcra
        self._lock = threading.Lock()
        self._in_flight: dict[int, int] = {}

    def admit(self, key: ApiKey, reserve: int, metered: bool = True) -> Admission:
        """Reserve one request slot and `reserve` tokens, or say why not and for how long.

        An unmetered call (one that runs no model: /tokenize, /detokenize) takes only a
        concurrency slot; requests and tokens per minute are left as they are."""
        with self._lock:
            if (
                key.max_concurrent is not None
                and self._in_flight.get(key.id, 0) >= key.max_concurrent
            ):
                return Admission(
                    False,
                    "concurrency",
                    CONCURRENCY_RETRY_S,
                    f"too many concurrent requests for this key (limit {key.max_concurrent})",
                    {**self.headers(key), **_concurrency_headers(key.max_concurrent)},
                )
            self._in_flight[key.id] = self._in_flight.get(key.id, 0) + 1
        if not metered:
            return Admission(True, headers=self.headers(key))
        requests = self._acquire(key, "rpm", key.rpm, 1)
        tokens = self._acquire(key, "tpm", key.tpm, reserve) if _passed(requests) else None
        if not _passed(requests) or not _passed(tokens):
            self.release(key)
            if _passed(requests) and key.rpm is not None:
                self._gcra.adjust(f"rpm:{key.id}", key.rpm, -1)
            failed, what, limit = (
                (requests, "requests", key.rpm)
                if not _passed(requests)
                else (tokens, "tokens", key.tpm)
            )
            assert failed is not None
            return Admission(
                False,
                what,
                failed.retry_after_s,
                _rate_message(what, limit, reserve, failed),
                _headers(requests, tokens, key, self._gcra),
            )
        return Admission(True, headers=_headers(requests, tokens, key, self._gcra))

    def settle(self, key: ApiKey, reserved: int, charged: int) -> None:
        """Correct tokens/minute by what the response really used (usage, or what was sent)."""
        if key.tpm is not None:
            self._gcra.adjust(f"tpm:{key.id}", key.tpm, charged - reserved)

    def release(self, key: ApiKey) -> None:
        """End a request: free its concurrency slot."""
        with self._lock:
            self._in_flight[key.id] = self._in_flight.get(key.id, 1) - 1

    def withdraw(self, key: ApiKey, reserved: int) -> None:
        """Undo an admission refused later (by the quota): its slot, request and tokens."""
        self.settle(key, reserved, 0)
        if key.rpm is not None:
            self._gcra.adjust(f"rpm:{key.id}", key.rpm, -1)
        self.release(key)

    def headers(self, key: ApiKey) -> dict[str, str]:
        return _headers(None, None, key, self._gcra)

    def in_flight(self, key: ApiKey) -> int:
        return self._in_flight.get(key.id, 0)

    def _acquire(
        self, key: ApiKey, dimension: str, limit: int | None, cost: int
    ) -> RateState | None:
        if limit is None:
            return None
        return self._gcra.acquire(f"{dimension}:{key.id}", limit, cost)


def quota_exceeded(
    key: ApiKey, used: int, reserve: int, now: float, headers: dict[str, str]
) -> Admission:
    """Why a request does not fit the key's token quota, and when the period resets: the
    quota's `x-ratelimit-*-quota-tokens` headers, and `Retry-After` when the request fits a
    fresh period (none when it can never pass: larger than the quota, or no period)."""
    assert key.quota_tokens is not None
    reset_at = key.quota_reset_at(now)
    wait = None if reset_at is None or reserve > key.quota_tokens else reset_at - now
    quota = {
        "x-ratelimit-limit-quota-tokens": str(key.quota_tokens),
        "x-ratelimit-remaining-quota-tokens": str(max(0, key.quota_tokens - used)),
    }
    if reset_at is not None:
        quota["x-ratelimit-reset-quota-tokens"] = format_reset(reset_at - now)
    if wait is None or wait > CLIENT_RETRY_HORIZON_S:
        quota["x-should-retry"] = "false"
    return Admission(
        False,
        "insufficient_quota",
        wait,
        f"token quota exhausted for this key: {used} of {key.quota_tokens} used,"
        f" this request reserves {reserve}",
        {**headers, **quota},
    )


def limit_error(reason: str, message: str) -> APIError:
    """The 429 for a refused admission: OpenAI's `insufficient_quota`, else a rate limit."""
    if reason == "insufficient_quota":
        return APIError(429, message, type="insufficient_quota", code="insufficient_quota")
    code = "concurrency_limit_exceeded" if reason == "concurrency" else "rate_limit_exceeded"
    return APIError(429, message, type=reason, code=code)


def _concurrency_headers(limit: int) -> dict[str, str]:
    """What a concurrency refusal says of the cap: its size, and that no slot is free."""
    return {"x-ratelimit-limit-concurrency": str(limit), "x-ratelimit-remaining-concurrency": "0"}


def _passed(state: RateState | None) -> bool:
    return state is None or state.allowed


def _rate_message(what: str, limit: int | None, cost: int, state: RateState) -> str:
    per = "requests per minute" if what == "requests" else "tokens per minute"
    asked = "1 request" if what == "requests" else f"{cost} tokens"
    if math.isinf(state.retry_after_s):
        return f"request too large: {asked} can never fit the limit of {limit} {per}"
    return f"rate limit of {limit} {per} reached ({asked}); retry in {state.retry_after_s:.3f}s"


def _headers(
    requests: RateState | None, tokens: RateState | None, key: ApiKey, gcra: Gcra
) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, limit, state, bucket in (
        ("requests", key.rpm, requests, f"rpm:{key.id}"),
        ("tokens", key.tpm, tokens, f"tpm:{key.id}"),
    ):
        if limit is None:
            continue
        state = state or gcra.peek(bucket, limit)
        headers[f"x-ratelimit-limit-{name}"] = str(limit)
        headers[f"x-ratelimit-remaining-{name}"] = str(state.remaining)
        headers[f"x-ratelimit-reset-{name}"] = format_reset(state.reset_s)
    return headers
