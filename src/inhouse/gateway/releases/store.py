"""The release store: numbered, immutable releases per public model (or LoRA adapter), which
one is stable, which one is the candidate and its shares, and every change to them (who,
when, what, why).

A release is what a model's requests are answered by: its backends (named backends of the
gateway config, or URLs), the manifest they serve, and the sampling defaults and output
cap the gateway applies. Release 1 of a model is made, the first time a release command
runs, from the model's backends in the gateway config.

Each model's `release_state` row carries a version that every change bumps with a
compare-and-set update, so two operators (or an operator and the guardrail) never
overwrite each other: the second one is told to retry. Gateways read the state row on
every request and reload the releases when its version moved (see `canary`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from sqlalchemy import Engine, bindparam, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from inhouse.gateway.db import release_events, release_state, releases

MAX_SHARE = 100.0
_STATE_FIELDS = ("model", "version", "stable", "candidate", "percent", "shadow", "since")
_STATE_SQL = f"SELECT {', '.join(_STATE_FIELDS)} FROM release_state WHERE model = ?"


class ReleaseError(ValueError):
    """A release command that cannot be carried out; the message says why."""


@dataclass(frozen=True, slots=True)
class BackendRef:
    """A backend of a release: a backend named in the gateway config, or an URL."""

    name: str
    url: str | None = None
    kind: str = "inhouse"
    model: str | None = None  # the upstream's model name (default: the configured one's)
    api_key_env: str | None = None  # where the gateway finds the upstream's key

    @classmethod
    def parse(cls, value: str, **extra: Any) -> BackendRef:
        """`--backend NAME|URL`: an http(s) URL is an URL backend, anything else a name."""
        if value.startswith(("http://", "https://")):
            return cls(name=value.split("://", 1)[1].rstrip("/"), url=value.rstrip("/"), **extra)
        return cls(name=value)


@dataclass(frozen=True, slots=True)
class Guardrails:
    """When a candidate is rolled back on its own: any threshold crossed over `window_s`,
    once `min_samples` requests (or shadow pairs, for agreement) were seen."""

    max_error_rate: float = 0.05
    max_p99_ttft_s: float | None = None
    min_agreement: float | None = None
    min_samples: int = 20
    window_s: float = 300.0

    def __post_init__(self) -> None:
        if not 0 <= self.max_error_rate <= 1:
            raise ReleaseError("max_error_rate must be between 0 and 1")
        if self.min_agreement is not None and not 0 <= self.min_agreement <= 1:
            raise ReleaseError("min_agreement must be between 0 and 1")
        if self.max_p99_ttft_s is not None and self.max_p99_ttft_s <= 0:
            raise ReleaseError("max_p99_ttft_s must be > 0")
        if not 1 <= self.min_samples <= 1_000_000 or not 1 <= self.window_s <= 30 * 86400:
            raise ReleaseError("min_samples must be 1..1e6 and window_s 1 s..30 d")


@dataclass(frozen=True, slots=True)
class Release:
    """One numbered release of a model."""

    id: int
    model: str
    number: int
    created_at: float
    backends: tuple[BackendRef, ...]
    manifest_digest: str | None = None
    manifest: dict[str, Any] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    max_output: int | None = None
    guardrails: Guardrails = field(default_factory=Guardrails)
    adapter: str | None = None  # an adapter's release: the version it sends (`canary`)


@dataclass(frozen=True, slots=True)
class ReleaseState:
    """Which release of a model answers: the stable one, and the candidate with its shares
    (percent of keys canaried, percent of the stable's requests mirrored to it)."""

    model: str
    version: int
    stable: int
    candidate: int | None
    percent: float
    shadow: float
    since: float


@dataclass(frozen=True, slots=True)
class NewRelease:
    """What a release command gives for a new release (the store numbers it)."""

    backends: tuple[BackendRef, ...]
    manifest_digest: str | None = None
    manifest: dict[str, Any] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    max_output: int | None = None
    guardrails: Guardrails = field(default_factory=Guardrails)
    adapter: str | None = None


class ReleaseStore:
    """Releases, their state and their change log in the gateway database."""

    def __init__(self, db: Engine, clock: Callable[[], float] = time.time) -> None:
        self._db = self.db = db
        self._clock = clock
        self.reads_inline = db.dialect.name == "sqlite"  # as KeyStore.lookup_is_local
        self._by_model = select(release_state).where(release_state.c.model == bindparam("model"))
        self._local = threading.local()

    def state(self, model: str) -> ReleaseState | None:
        """The model's state row, or None while it has no releases (read on every request:
        on SQLite through a DB-API connection this thread keeps, as `KeyStore` does: ~6 µs of CPU
        instead of ~75 µs; the cursor closes after its statement, so no snapshot lingers)."""
        if not self.reads_inline:
            with self._db.connect() as conn:
                row = conn.execute(self._by_model, {"model": model}).first()
            return None if row is None else ReleaseState(**row._mapping)
        raw = getattr(self._local, "connection", None)
        if raw is None:
            raw = self._local.connection = self._db.raw_connection()
        cursor = raw.cursor()
        try:
            cursor.execute(_STATE_SQL, (model,))
            found = cursor.fetchone()
        finally:
            cursor.close()
        return None if found is None else ReleaseState(*found)

    def releases(self, model: str) -> dict[int, Release]:
        """Every release of the model by number."""
        query = select(releases).where(releases.c.model == model).order_by(releases.c.number)
        with self._db.connect() as conn:
            return {r.number: _release(r._mapping) for r in conn.execute(query)}

    def events(self, model: str, limit: int = 20) -> list[dict[str, Any]]:
        """The model's newest change-log rows, newest first."""
        c = release_events.c
        query = select(release_events).where(c.model == model).order_by(c.id.desc()).limit(limit)
        with self._db.connect() as conn:
            return [
                {**r._mapping, "detail": json.loads(r.detail or "{}")} for r in conn.execute(query)
            ]

    def canary(
        self, model: str, first: NewRelease | None, new: NewRelease | None, percent: float,
        shadow: float, actor: str, reason: str | None,
    ) -> ReleaseState:  # fmt: skip
        """Make `new` the candidate at these shares (`first` becomes release 1 when the model
        has none yet); with `new` None, change the shares of the current candidate."""
        _check_share(percent, "percent")
        _check_share(shadow, "shadow")
        with self._db.begin() as conn:
            state = self._state_for_update(conn, model, first, actor)
            if new is None:
                if state.candidate is None:
                    raise ReleaseError(f"{model!r} has no candidate: give --backend")
                candidate, action = state.candidate, "share"
            else:
                if state.candidate is not None:
                    raise ReleaseError(
                        f"{model!r} already has candidate release {state.candidate}: "
                        "promote it or roll it back first"
                    )
                candidate, action = self._add(conn, model, new, actor), "canary"
            since = state.since if new is None else self._clock()
            self._move(conn, state, candidate=candidate, percent=percent, shadow=shadow,
                       since=since)  # fmt: skip
            detail = {"candidate": candidate, "percent": percent, "shadow": shadow}
            self._log(conn, model, actor, action, candidate, detail, reason)
        return self._require(model)

    def ensure_stable(
        self, model: str, new: NewRelease, actor: str, reason: str | None
    ) -> ReleaseState:
        """Make `new` the stable release: release 1 of a model without releases; nothing
        when the stable release already has its backends and manifest; else a new release
        that replaces the stable one and drops any candidate (`inhouse up`, whose replicas
        are the model's backends)."""
        with self._db.begin() as conn:
            state = self._state_for_update(conn, model, new, actor)
            c = releases.c
            query = select(releases).where(c.model == model, c.number == state.stable)
            stable = _release(conn.execute(query).one()._mapping)
            if (stable.backends, stable.manifest_digest) != (new.backends, new.manifest_digest):
                number = self._add(conn, model, new, actor)
                self._move(conn, state, stable=number, candidate=None, percent=0.0,
                           shadow=0.0, since=self._clock())  # fmt: skip
                detail = {"dropped": state.candidate, "from": state.stable, "to": number}
                self._log(conn, model, actor, "replace", number, detail, reason)
        return self._require(model)

    def promote(self, model: str, actor: str, reason: str | None) -> ReleaseState:
        """The candidate becomes the stable release for every request."""
        with self._db.begin() as conn:
            state = self._existing(conn, model)
            if state.candidate is None:
                raise ReleaseError(f"{model!r} has no candidate to promote")
            self._move(conn, state, stable=state.candidate, candidate=None, percent=0.0,
                       shadow=0.0, since=self._clock())  # fmt: skip
            detail = {"from": state.stable, "to": state.candidate}
            self._log(conn, model, actor, "promote", state.candidate, detail, reason)
        return self._require(model)

    def rollback(
        self, model: str, actor: str, reason: str | None, to: int | None = None,
        action: str = "rollback", expect_version: int | None = None,
    ) -> ReleaseState | None:  # fmt: skip
        """Drop the candidate; with `to`, also make release `to` the stable one; with neither
        a candidate nor `to`, go back to the release before the stable one. With
        `expect_version` (the guardrail), do nothing and return None if the state moved."""
        with self._db.begin() as conn:
            state = self._existing(conn, model)
            if expect_version is not None and state.version != expect_version:
                return None
            known = self._numbers(conn, model)
            if to is None and state.candidate is None:
                earlier = [n for n in known if n < state.stable]
                if not earlier:
                    raise ReleaseError(f"{model!r} has no candidate and no earlier release")
                to = earlier[-1]
            if to is not None and to not in known:
                raise ReleaseError(f"{model!r} has no release {to}; it has {known}")
            stable = state.stable if to is None else to
            self._move(conn, state, stable=stable, candidate=None, percent=0.0, shadow=0.0,
                       since=self._clock())  # fmt: skip
            detail = {"dropped": state.candidate, "from": state.stable, "to": stable}
            self._log(conn, model, actor, action, state.candidate or stable, detail, reason)
        return self._require(model)

    def _require(self, model: str) -> ReleaseState:
        state = self.state(model)
        assert state is not None
        return state

    def _existing(self, conn: Any, model: str) -> ReleaseState:
        row = conn.execute(self._by_model, {"model": model}).first()
        if row is None:
            raise ReleaseError(f"{model!r} has no releases yet: start with `release canary`")
        return ReleaseState(**row._mapping)

    def _state_for_update(
        self, conn: Any, model: str, first: NewRelease | None, actor: str
    ) -> ReleaseState:
        """The model's state, made (with `first` as release 1, stable) when it has none."""
        row = conn.execute(self._by_model, {"model": model}).first()
        if row is not None:
            return ReleaseState(**row._mapping)
        if first is None:
            raise ReleaseError(
                f"{model!r} has no releases yet: give the gateway config (--config), whose "
                "backends become release 1"
            )
        number = self._add(conn, model, first, actor)
        values = {"model": model, "version": 1, "stable": number, "candidate": None,
                  "percent": 0.0, "shadow": 0.0, "since": self._clock()}  # fmt: skip
        try:
            conn.execute(insert(release_state), values)
        except IntegrityError:
            raise ReleaseError(f"{model!r} was changed meanwhile; run the command again") from None
        return ReleaseState(**values)

    def _add(self, conn: Any, model: str, new: NewRelease, actor: str) -> int:
        top = conn.execute(
            select(func.max(releases.c.number)).where(releases.c.model == model)
        ).scalar()
        number = (top or 0) + 1
        try:
            conn.execute(insert(releases), {**_encode(new), "model": model, "number": number,
                                            "created_at": self._clock()})  # fmt: skip
        except IntegrityError:
            raise ReleaseError(f"{model!r} was changed meanwhile; run the command again") from None
        detail = {"backends": [asdict(b) for b in new.backends], "manifest": new.manifest_digest}
        if new.adapter is not None:
            detail["adapter"] = new.adapter
        self._log(conn, model, actor, "create", number, detail, None)
        return number

    def _move(self, conn: Any, state: ReleaseState, **changes: Any) -> None:
        """Compare-and-set: apply `changes` and bump the version, or ReleaseError."""
        c = release_state.c
        done = conn.execute(
            update(release_state)
            .where(c.model == state.model, c.version == state.version)
            .values(**changes, version=state.version + 1)
        )
        if done.rowcount != 1:
            raise ReleaseError(f"{state.model!r} was changed meanwhile; run the command again")

    def _numbers(self, conn: Any, model: str) -> list[int]:
        query = select(releases.c.number).where(releases.c.model == model)
        return sorted(conn.execute(query).scalars())

    def _log(
        self, conn: Any, model: str, actor: str, action: str, release: int | None,
        detail: dict[str, Any], reason: str | None,
    ) -> None:  # fmt: skip
        conn.execute(
            insert(release_events),
            {"ts": self._clock(), "model": model, "actor": actor[:200], "action": action,
             "release": release, "detail": json.dumps(detail), "reason": reason},
        )  # fmt: skip


def _check_share(value: float, what: str) -> None:
    if not 0 <= value <= MAX_SHARE:
        raise ReleaseError(f"--{what} must be between 0 and 100, got {value}")


def _encode(new: NewRelease) -> dict[str, Any]:
    return {
        "backends": json.dumps([asdict(b) for b in new.backends]),
        "manifest_digest": new.manifest_digest,
        "manifest": None if new.manifest is None else json.dumps(new.manifest),
        "sampling": json.dumps(new.sampling),
        "max_output": new.max_output,
        "guardrails": json.dumps(asdict(new.guardrails)),
        "adapter": new.adapter,
    }


_GUARDRAIL_FIELDS = {f.name for f in fields(Guardrails)}


def _release(row: Any) -> Release:
    guardrails = {k: v for k, v in json.loads(row["guardrails"] or "{}").items()
                  if k in _GUARDRAIL_FIELDS}  # fmt: skip
    return Release(
        id=row["id"],
        model=row["model"],
        number=row["number"],
        created_at=row["created_at"],
        backends=tuple(BackendRef(**b) for b in json.loads(row["backends"])),
        manifest_digest=row["manifest_digest"],
        manifest=None if row["manifest"] is None else json.loads(row["manifest"]),
        sampling=json.loads(row["sampling"] or "{}"),
        max_output=row["max_output"],
        guardrails=Guardrails(**guardrails),
        adapter=row["adapter"],
    )
