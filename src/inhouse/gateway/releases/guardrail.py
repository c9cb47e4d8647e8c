"""The guardrail: every `guard_interval_s` each gateway replica checks the candidates it
routes to against their release's thresholds, over the last `window_s` (and not before the
candidate took its place), and rolls back one that crosses any of them once it has
`min_samples` answers (shadow pairs, for agreement):

- error rate (answers with status >= 500) above `max_error_rate`;
- p99 TTFT above `max_p99_ttft_s`;
- invalid JSON for json_schema requests (answered, or shadowed) more often than
  `max_error_rate`;
- agreement of its shadow answers with the primary's below `min_agreement`;
- every replica of the candidate down (no samples needed).

The rollback is the store's compare-and-set on the state version this replica saw, so
replicas that find the same breach roll back once; the event names the threshold, and
`inhouse:gateway_release_rollbacks` counts it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from inhouse.gateway.backends import Backend, BackendState
from inhouse.gateway.releases.figures import live_figures, shadow_figures
from inhouse.gateway.releases.metrics import ReleaseMetrics
from inhouse.gateway.releases.store import Guardrails, ReleaseState, ReleaseStore

log = logging.getLogger("inhouse.gateway.releases")

ACTOR = "guardrail"


def breach(
    store: ReleaseStore, state: ReleaseState, guard: Guardrails, pool: list[Backend], now: float
) -> str | None:
    """The threshold the candidate crosses now (one of `ROLLBACK_REASONS`), or None."""
    assert state.candidate is not None
    if pool and all(b.state is BackendState.DOWN for b in pool):
        return "candidate_down"
    since = max(state.since, now - guard.window_s)
    enough = guard.min_samples
    live = live_figures(store.db, state.model, state.candidate, since)
    if live.requests >= enough and live.errors.value > guard.max_error_rate:
        return "error_rate"
    p99_ms = live.ttft_ms.p99 if live.ttft_ms.n >= enough else None
    limit_ms = None if guard.max_p99_ttft_s is None else guard.max_p99_ttft_s * 1000
    if p99_ms is not None and limit_ms is not None and p99_ms > limit_ms:
        return "p99_ttft"
    pairs = shadow_figures(store.db, state.model, state.candidate, since)
    for checked in (live.json_valid, pairs.json_valid.shadow):
        if checked.n >= enough and 1 - checked.value > guard.max_error_rate:
            return "invalid_json"
    agreement = pairs.agreement.value if pairs.agreement.n >= enough else None
    if agreement is not None and guard.min_agreement is not None:
        return "agreement" if agreement < guard.min_agreement else None
    return None


class Guardrail:
    """Checks the candidates `candidates()` returns, each interval, until cancelled."""

    def __init__(
        self, store: ReleaseStore, metrics: ReleaseMetrics,
        candidates: Callable[[], dict[str, tuple[ReleaseState, list[Backend]]]],
        interval_s: float, clock: Callable[[], float] = time.time,
    ) -> None:  # fmt: skip
        self._store, self._metrics, self._candidates = store, metrics, candidates
        self._interval, self._clock = interval_s, clock

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await asyncio.to_thread(self.check_all)
            except Exception as exc:  # the loop must outlive a database outage
                log.error("guardrail: check failed (%s)", type(exc).__name__)

    def check_all(self) -> list[str]:
        """Check every candidate once; the models rolled back."""
        rolled = []
        for model, (seen, pool) in self._candidates().items():
            state = self._store.state(model)
            if state is None or state.candidate is None or state.version != seen.version:
                continue  # changed since this replica last routed: checked next round
            release = self._store.releases(model)[state.candidate]
            reason = breach(self._store, state, release.guardrails, pool, self._clock())
            if reason is None:
                continue
            done = self._store.rollback(
                model, ACTOR, f"guardrail: {reason}", action="auto_rollback",
                expect_version=state.version,
            )  # fmt: skip
            if done is not None:
                log.warning("guardrail: rolled back %s release %d (%s)", model, state.candidate,
                            reason)  # fmt: skip
                self._metrics.rollbacks.labels(model, reason).inc()
                rolled.append(model)
        return rolled
