"""`inhouse up` makes its replicas each model's stable release in the gateway database it
uses: release 1 on the first start, a new release when a later start runs other replicas
(or another manifest). So `inhouse release canary|status|promote|rollback` work against a
running `inhouse up` (as `make run` starts it) with no gateway config file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inhouse.gateway.config import GatewayConfig
    from inhouse.manifests.manifest import Manifest

ACTOR = "inhouse up"


def ensure_stable_releases(
    config: GatewayConfig, chat: str, manifest: tuple[Path, Manifest] | None,
    slots: tuple[str, ...] = (),
) -> dict[str, int]:  # fmt: skip
    """Each model's stable release number, made of the backends `config` names and the
    replica `slots` the autoscaler may fill (`up.autoscale`); the `chat` model's pins
    `manifest` (its file and what it pins, already verified), when given."""
    # SQLAlchemy: loaded when `up` runs, not with the CLI.
    from inhouse.gateway.db_open import open_database
    from inhouse.gateway.release_tools.command import pinned_manifest
    from inhouse.gateway.releases.store import BackendRef, NewRelease, ReleaseStore

    pinned = (None, None) if manifest is None else pinned_manifest(*manifest)
    db = open_database(config.database)
    try:
        store, numbers = ReleaseStore(db), {}
        for route in config.models:
            digest, summary = pinned if route.name == chat else (None, None)
            names = [b.name for b in route.backends]
            names += [name for name in slots if name not in names]
            new = NewRelease(tuple(BackendRef(name=n) for n in names), digest, summary)
            state = store.ensure_stable(route.name, new, ACTOR, "the replicas `inhouse up` runs")
            numbers[route.name] = state.stable
        return numbers
    finally:
        db.dispose()
