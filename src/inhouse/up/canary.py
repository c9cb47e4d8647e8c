"""`inhouse up --canary MANIFEST --percent P`: one candidate replica of what a manifest pins,
started beside the stable replicas (its files verified first), made the model's candidate
release once it is ready, and stopped when that release is rolled back.

The candidate's key is random like every replica's; the gateway, running in this process,
reads it from `CANARY_KEY_ENV`.
"""

from __future__ import annotations

import os
import secrets
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from inhouse.gateway.release_tools.command import pinned_manifest
from inhouse.launch.base import Endpoint, Engine, Health, LaunchSettings
from inhouse.launch.ports import free_port
from inhouse.manifests.command import checked_manifest
from inhouse.manifests.manifest import Manifest

if TYPE_CHECKING:
    from inhouse.gateway.config import GatewayConfig
    from inhouse.gateway.releases.store import ReleaseStore
    from inhouse.launch.replicas import Replica

CANARY_KEY_ENV = "INHOUSE_UP_CANARY_KEY"
ACTOR = "inhouse up"
POLL_S = 1.0


@dataclass
class Candidate:
    """The candidate replica and the manifest it serves."""

    replica: Replica
    manifest: Manifest
    manifest_path: Path


def start_candidate(
    engine: Engine, manifest_path: Path, settings_for: Callable[[str], LaunchSettings],
    index: int, promised: set[int],
) -> Candidate:  # fmt: skip
    """Verify the manifest's files, then start one replica of its model (label `index`)
    with the settings `settings_for` gives its source, on a port outside `promised`."""
    # httpx: loaded when `up` runs, not with the CLI.
    from inhouse.launch.replicas import start_replica

    pinned = checked_manifest(manifest_path)
    settings = replace(
        settings_for(str(pinned.source_path())), manifest=str(manifest_path.resolve())
    )
    endpoint = Endpoint("127.0.0.1", free_port(promised), pinned.name, secrets.token_urlsafe(32))
    promised.add(endpoint.port)
    command = engine.command(settings, endpoint)
    replica = start_replica(engine, command, endpoint, index, sys.stdout, not settings.gpu)
    typer.echo(f"candidate {replica.label}: pid {replica.popen.pid} on {replica.url}")
    return Candidate(replica, pinned, manifest_path)


class CanaryWatch(threading.Thread):
    """Waits for the candidate to be ready, makes it the candidate release at the given
    shares, then stops its replica once the release is neither candidate nor stable."""

    def __init__(
        self, candidate: Candidate, config: GatewayConfig, model: str, percent: float,
        shadow: float, stop: threading.Event,
    ) -> None:  # fmt: skip
        super().__init__(name="canary-watch", daemon=True)
        self.candidate, self.config, self.model = candidate, config, model
        self.percent, self.shadow, self.stop = percent, shadow, stop
        self.release: int | None = None

    def run(self) -> None:
        # SQLAlchemy and httpx: loaded when `up --canary` runs, not with the CLI.
        from inhouse.gateway.db_open import open_database
        from inhouse.gateway.releases.store import ReleaseError, ReleaseStore
        from inhouse.launch.replicas import stop_replicas, wait_started

        replica = self.candidate.replica
        if wait_started([replica], stop=self.stop)[replica.label] is not Health.READY:
            typer.echo(f"inhouse up: {replica.failure()}; no canary", err=True)
            return
        store = ReleaseStore(open_database(self.config.database))
        try:
            self.release = self._register(store)
        except ReleaseError as err:
            typer.echo(f"inhouse up: no canary: {err}", err=True)
            stop_replicas([replica])
            return
        typer.echo(f"candidate release {self.release} of {self.model!r} takes "
                   f"{self.percent:g}% of keys (shadow {self.shadow:g}%)")  # fmt: skip
        while not self.stop.wait(POLL_S):
            state = store.state(self.model)
            if state is not None and self.release in (state.candidate, state.stable):
                continue
            typer.echo(f"candidate release {self.release} was rolled back; stopping "
                       f"{replica.label}")  # fmt: skip
            stop_replicas([replica])
            return

    def _register(self, store: ReleaseStore) -> int:
        """The candidate as the model's new candidate release (replacing one left by an
        earlier `inhouse up`, whose replica is gone); its number."""
        from inhouse.gateway.releases.store import BackendRef, NewRelease  # SQLAlchemy, as in run()

        replica = self.candidate.replica
        os.environ[CANARY_KEY_ENV] = replica.endpoint.api_key
        route = self.config.model(self.model)
        assert route is not None
        state = store.state(self.model)
        if state is not None and state.candidate is not None:
            store.rollback(self.model, ACTOR, "replaced by a new `inhouse up --canary`")
        ref = BackendRef(
            name=replica.label, url=replica.url, kind=route.backends[0].kind,
            model=self.candidate.manifest.name, api_key_env=CANARY_KEY_ENV,
        )  # fmt: skip
        digest, summary = pinned_manifest(self.candidate.manifest_path, self.candidate.manifest)
        first = NewRelease(tuple(BackendRef(name=b.name) for b in route.backends))
        new = NewRelease((ref,), digest, summary)
        reason = f"inhouse up --canary {self.candidate.manifest_path.name}"
        done = store.canary(self.model, first, new, self.percent, self.shadow, ACTOR, reason)
        assert done.candidate is not None
        return done.candidate
