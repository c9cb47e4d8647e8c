"""Which release answers a request: the stable one, or the candidate for the keys whose
bucket falls in its share, and whether the request is mirrored to the candidate.

A LoRA adapter has releases of its own, kept under its public name: each sends the adapter
version it names (`Release.adapter`, e.g. `support-v2` loaded beside `support`; default:
the public name) to those of its replicas serving that version now.

The bucket is a hash of the key's id and the candidate release's id, so a key stays on
one release for as long as that candidate does (a person sees one model for a session),
a new candidate draws a new set of keys, and raising the share only adds keys.

Freshness: every request reads its model's `release_state` row (one indexed lookup, like
the key itself; inline on SQLite, in a worker thread on a network database) and reloads
the model's releases only when the row's version moved. A promote or rollback through any
gateway replica therefore applies from the next request on every replica.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inhouse.gateway.backends import Backend, BackendState
from inhouse.gateway.config import ModelRoute, Upstream
from inhouse.gateway.keys import ApiKey
from inhouse.gateway.releases.store import BackendRef, Release, ReleaseState, ReleaseStore
from inhouse.gateway.routing import Router

BUCKETS = 10_000

log = logging.getLogger("inhouse.gateway.releases")


@dataclass(frozen=True, slots=True)
class Answering:
    """A release as the request path uses it: its number and the replicas that serve it."""

    number: int
    pool: list[Backend]
    sampling: dict[str, Any]
    max_output: int | None
    candidate: bool
    adapter: str | None = None  # the adapter version it sends (None: the one asked for)

    def sends(self, asked: str | None) -> str | None:
        """The adapter sent upstream for a request that asked for `asked` (None: the base)."""
        return None if asked is None else self.adapter or asked

    def replicas(self, asked: str | None) -> list[Backend]:
        """Its replicas that can answer a request for `asked`: for an adapter, those that
        serve the version it sends now."""
        sent = self.sends(asked)
        return self.pool if sent is None else [b for b in self.pool if sent in b.adapters]


@dataclass(frozen=True, slots=True)
class ReleasePick:
    """The release that answers one request; `stable` is where it goes when the candidate
    has no replica to take it; `shadow` the candidate it is mirrored to, if any."""

    answering: Answering
    stable: Answering | None = None
    shadow: Answering | None = None

    def on_stable(self) -> ReleasePick:
        """The same request answered by the stable release instead of the candidate."""
        assert self.stable is not None
        return ReleasePick(self.stable)

    def routable(self, asked: str | None = None) -> ReleasePick:
        """This pick, or the stable one when no replica of the candidate (serving the
        adapter version, for an adapter `asked` for) is up (a request never waits for a
        candidate that is down)."""
        up = (b.state is BackendState.UP for b in self.answering.replicas(asked))
        if self.stable is None or any(up):
            return self
        return self.on_stable()


@dataclass(slots=True)
class _View:
    """One model's releases as resolved for routing, for one state version."""

    state: ReleaseState
    stable: Answering
    candidate: Answering | None
    candidate_id: int
    generation: int  # the router's, when resolved: replicas added or removed since resolve again


def bucket(key_id: int, release_id: int) -> int:
    """The key's place (0 to BUCKETS-1) for this candidate release: the same on every
    replica and every request."""
    digest = hashlib.blake2b(f"{key_id}:{release_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % BUCKETS


def on_candidate(key_id: int, release_id: int, percent: float) -> bool:
    """Whether the key is in the candidate's share."""
    return bucket(key_id, release_id) < round(percent * BUCKETS / 100)


class ReleaseRouter:
    """Picks each request's release from the state the database holds now."""

    def __init__(
        self, store: ReleaseStore, router: Router, on_change: Callable[[ReleaseState], None],
        draw: Callable[[], float] = random.random,
    ) -> None:  # fmt: skip
        self.store = store
        self._router = router
        self._on_change = on_change
        self._draw = draw
        self._views: dict[str, _View] = {}
        # URL backends by (model, reference): a new release at the same URL with another
        # upstream model, kind or key variable gets its own replica, never the old one's.
        self._extra: dict[tuple[str, BackendRef], Backend] = {}

    async def pick(
        self, key: ApiKey, route: ModelRoute, adapter: str | None = None
    ) -> ReleasePick | None:
        """The release for this key's request (for `adapter` on `route`'s replicas, when
        one is asked for); None while the model or adapter has no releases."""
        name = adapter or route.name
        if self.store.reads_inline:
            state = self.store.state(name)
        else:
            state = await asyncio.to_thread(self.store.state, name)
        if state is None:
            return None
        view = self._views.get(name)
        if (
            view is None
            or view.state.version != state.version
            or view.generation != self._router.generation
        ):
            loaded = await asyncio.to_thread(self.store.releases, name)
            view = self._views[name] = self._resolve(route, state, loaded)
            self._forget_unused()
            self._on_change(state)
        candidate = view.candidate
        if candidate is None:
            return ReleasePick(view.stable)
        if on_candidate(key.id, view.candidate_id, state.percent):
            return ReleasePick(candidate, stable=view.stable)
        mirrored = state.shadow > 0 and self._draw() * 100 < state.shadow
        return ReleasePick(view.stable, shadow=candidate if mirrored else None)

    def candidates(self) -> dict[str, tuple[ReleaseState, list[Backend]]]:
        """The models with a candidate as last seen, with the candidate's replicas."""
        return {
            model: (view.state, view.candidate.pool)
            for model, view in self._views.items()
            if view.candidate is not None
        }

    def _resolve(self, route: ModelRoute, state: ReleaseState, loaded: dict[int, Release]) -> _View:
        stable = self._answering(route, loaded[state.stable], candidate=False)
        if state.candidate is None:
            return _View(state, stable, None, 0, self._router.generation)
        release = loaded[state.candidate]
        candidate = self._answering(route, release, True)
        return _View(state, stable, candidate, release.id, self._router.generation)

    def _answering(self, route: ModelRoute, release: Release, candidate: bool) -> Answering:
        pool = [self._backend(route, ref) for ref in release.backends]
        found = [b for b in pool if b is not None]
        if not found and not candidate:  # a stable release never leaves a model unserved
            log.warning("release %d of %r names no backend this gateway knows; its "
                        "configured backends answer", release.number, route.name)  # fmt: skip
            found = self._router.backends[route.name]
        return Answering(release.number, found, release.sampling, release.max_output, candidate,
                         release.adapter)  # fmt: skip

    def _forget_unused(self) -> None:
        """Stop routing to and checking URL backends no current release names."""
        in_use = {id(b) for v in self._views.values() for a in (v.stable, v.candidate)
                  if a is not None for b in a.pool}  # fmt: skip
        for where, backend in list(self._extra.items()):
            if id(backend) not in in_use:
                del self._extra[where]
                self._router.extra.remove(backend)

    def _backend(self, route: ModelRoute, ref: BackendRef) -> Backend | None:
        """The replica a reference names: a configured one (this model's first, then any
        model's), or a new one for an URL, health-checked like the rest from now on."""
        if ref.url is None:
            named = [b for b in self._router.backends[route.name] if b.upstream.name == ref.name]
            named += [b for b in self._router.all_backends() if b.upstream.name == ref.name]
            return named[0] if named else None
        found = self._extra.get((route.name, ref))
        if found is None:
            template = route.backends[0]
            upstream = Upstream(
                name=ref.name,
                url=ref.url,
                api_key=_api_key(ref),
                model=ref.model or template.model,
                kind=ref.kind,
                max_in_flight=template.max_in_flight,
                capabilities=template.capabilities,
            )
            # Up until its health check says otherwise: whoever made the release started it.
            found = Backend(upstream=upstream, model=route.name, state=BackendState.UP)
            self._extra[(route.name, ref)] = found
            self._router.extra.append(found)
        return found


def _api_key(ref: BackendRef) -> str | None:
    """The URL backend's key, from the gateway's environment; an unset variable is logged
    (the upstream will refuse the gateway, see `upstream._key_refused`)."""
    if ref.api_key_env is None:
        return None
    key = os.environ.get(ref.api_key_env)
    if key is None:
        log.warning("release backend %s: $%s is not set in the gateway's environment; it is "
                    "sent no key", ref.url, ref.api_key_env)  # fmt: skip
    return key


def apply_release(body: dict[str, Any], answering: Answering) -> dict[str, Any]:
    """The body with the release's sampling defaults where the client set none."""
    missing = {k: v for k, v in answering.sampling.items() if k not in body}
    return {**body, **missing} if missing else body


def capped(output_cap: int, answering: Answering) -> int:
    """The output cap under the release's own cap."""
    return output_cap if answering.max_output is None else min(output_cap, answering.max_output)
