"""GCRA (generic cell rate algorithm): a smooth rate limit with one number of state.

A bucket allows `limit` units per `period`, in bursts of up to `limit`. Its state is
the theoretical arrival time (TAT): when the bucket would be empty again. A cost of
n moves TAT forward by n·period/limit; a request passes if the new TAT is no more
than one period ahead of now. Stores update TAT by compare-and-set, so the same
code runs on a dict (one process) or a table row per bucket (all replicas).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import Engine, insert, select, update
from sqlalchemy.exc import IntegrityError

from inhouse.gateway.db import limiter_state

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
