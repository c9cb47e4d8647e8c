"""The release store on a real SQLite file: numbering, state changes and their log, the
compare-and-set that keeps two writers apart, the sticky bucket, and the audit column an
older database gets."""

from __future__ import annotations

import math
import re

import pytest
from conftest import ManualClock
from sqlalchemy import insert

from inhouse.gateway.config import ConfigError
from inhouse.gateway.config_file import parse_config
from inhouse.gateway.db import audit_log
from inhouse.gateway.db_open import open_database
from inhouse.gateway.releases.canary import BUCKETS, bucket, on_candidate
from inhouse.gateway.releases.figures import live_figures, percentiles
from inhouse.gateway.releases.store import (
    BackendRef,
    Guardrails,
    NewRelease,
    ReleaseError,
    ReleaseStore,
)

FIRST = NewRelease((BackendRef("q4"),))
CANDIDATE = NewRelease((BackendRef.parse("http://127.0.0.1:9/"),), manifest_digest="ab" * 32)


@pytest.fixture
def releases(db_url: str, clock: ManualClock) -> ReleaseStore:
    return ReleaseStore(open_database(db_url), clock)


def test_first_canary_makes_release_one_from_the_config_and_the_candidate_two(
    releases: ReleaseStore,
) -> None:
    assert releases.state("smol") is None
    state = releases.canary("smol", FIRST, CANDIDATE, 10, 20, "ana", "q8 is better")
    assert (state.stable, state.candidate, state.percent, state.shadow) == (1, 2, 10, 20)
    known = releases.releases("smol")
    assert known[1].backends == (BackendRef("q4"),)
    assert known[2].backends[0].url == "http://127.0.0.1:9"
    assert known[2].manifest_digest == "ab" * 32
    actions = [(e["action"], e["release"], e["actor"]) for e in releases.events("smol")]
    assert actions == [("canary", 2, "ana"), ("create", 2, "ana"), ("create", 1, "ana")]
    assert releases.events("smol")[0]["reason"] == "q8 is better"


def test_share_change_promote_and_rollback_each_bump_the_version_and_log(
    releases: ReleaseStore, clock: ManualClock
) -> None:
    v1 = releases.canary("smol", FIRST, CANDIDATE, 5, 0, "ana", None)
    with pytest.raises(ReleaseError, match="already has candidate release 2"):
        releases.canary("smol", FIRST, CANDIDATE, 5, 0, "ana", None)
    clock.advance(60)
    wider = releases.canary("smol", FIRST, None, 25, 10, "ana", "looks fine")
    assert (wider.candidate, wider.percent, wider.version) == (2, 25, v1.version + 1)
    assert wider.since == v1.since  # the candidate's figures still count from its start
    promoted = releases.promote("smol", "bo", "a week clean")
    assert (promoted.stable, promoted.candidate, promoted.percent) == (2, None, 0)
    back = releases.rollback("smol", "bo", "complaints")  # no candidate: the one before
    assert back is not None and back.stable == 1
    again = releases.rollback("smol", "bo", None, to=2)
    assert again is not None and again.stable == 2 and again.version == v1.version + 4
    actions = [e["action"] for e in releases.events("smol")][:4]
    assert actions == ["rollback", "rollback", "promote", "share"]


def test_rollback_refuses_unknown_releases_and_models_without_releases(
    releases: ReleaseStore,
) -> None:
    with pytest.raises(ReleaseError, match="no releases yet"):
        releases.rollback("smol", "bo", None)
    releases.canary("smol", FIRST, CANDIDATE, 5, 0, "ana", None)
    with pytest.raises(ReleaseError, match="has no release 7"):
        releases.rollback("smol", "bo", None, to=7)
    releases.rollback("smol", "bo", None)  # drops candidate 2
    with pytest.raises(ReleaseError, match="no candidate to promote"):
        releases.promote("smol", "bo", None)
    with pytest.raises(ReleaseError, match="no candidate and no earlier release"):
        releases.rollback("smol", "bo", None)


def test_the_guardrail_rolls_back_only_the_state_it_judged(releases: ReleaseStore) -> None:
    seen = releases.canary("smol", FIRST, CANDIDATE, 5, 0, "ana", None)
    releases.canary("smol", FIRST, None, 50, 0, "ana", "wider")  # moved meanwhile
    assert releases.rollback("smol", "guardrail", "x", expect_version=seen.version) is None
    state = releases.state("smol")
    assert state is not None and state.candidate == 2


@pytest.mark.parametrize("share", [-1, 100.5, math.inf])
def test_shares_outside_0_to_100_are_refused(releases: ReleaseStore, share: float) -> None:
    with pytest.raises(ReleaseError, match="between 0 and 100"):
        releases.canary("smol", FIRST, CANDIDATE, share, 0, "ana", None)
    assert releases.state("smol") is None


def test_guardrails_are_bounded() -> None:
    with pytest.raises(ReleaseError):
        Guardrails(max_error_rate=2)
    with pytest.raises(ReleaseError):
        Guardrails(min_samples=0)


def test_a_key_keeps_its_bucket_and_a_new_candidate_draws_anew() -> None:
    assert bucket(7, 3) == bucket(7, 3)
    assert [bucket(k, 3) for k in range(50)] != [bucket(k, 4) for k in range(50)]
    share = sum(on_candidate(k, 3, 10) for k in range(20_000)) / 20_000
    assert 0.09 < share < 0.11
    assert all(0 <= bucket(k, 1) < BUCKETS for k in range(100))
    wider = {k for k in range(2000) if on_candidate(k, 3, 20)}
    assert {k for k in range(2000) if on_candidate(k, 3, 10)} <= wider  # widening adds keys


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentiles(values) == percentiles(values[::-1])
    figures = percentiles(values)
    assert (figures.n, figures.p50, figures.p99) == (100, 50.0, 99.0)
    assert percentiles([]).p99 is None and percentiles([7.0]).p50 == 7.0


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"shadow_max_in_flight": -1}, "shadow_max_in_flight >= 0"),
        ({"guard_interval_s": 0}, "guard_interval_s must be > 0"),
        ({"shadow_percent": 5}, "unknown key(s) in releases: shadow_percent"),
    ],
)
def test_the_releases_table_is_checked(table: dict[str, float], message: str) -> None:
    models = [{"name": "m", "backends": [{"url": "http://127.0.0.1:9"}]}]
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_config({"releases": table, "models": models})


def test_an_adapters_figures_are_its_own_rows_and_the_base_keeps_its_own(
    releases: ReleaseStore,
) -> None:
    """Releases of `support` and of its base `smol` both have a release 1: each one's live
    figures count only its own audit rows."""
    rows = [("smol", None, 200), ("smol", "support", 200), ("smol", "support", 500)]
    with releases.db.begin() as conn:
        conn.execute(insert(audit_log), [
            {"ts": 1.0, "key_name": "k", "model": m, "adapter": a, "endpoint": "chat",
             "status": s, "release": 1, "latency_ms": 5.0} for m, a, s in rows
        ])  # fmt: skip
    support = live_figures(releases.db, "support", 1, 0.0)
    smol = live_figures(releases.db, "smol", 1, 0.0)
    assert (support.requests, support.errors.k, smol.requests, smol.errors.k) == (2, 1, 1, 0)
