"""Prometheus series of releases, in the gateway's registry.

Series carry the release's role (`stable` or `candidate`), a bounded label; which release
number holds each role is `inhouse:gateway_release_info`, one series per model and role.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from inhouse.gateway.metrics import LATENCY_BUCKETS
from inhouse.gateway.releases.store import ReleaseState

ROLES = ("stable", "candidate")
SHADOW_OUTCOMES = ("sent", "dropped", "failed", "timeout", "skipped")
ROLLBACK_REASONS = ("candidate_down", "error_rate", "p99_ttft", "invalid_json", "agreement")


class ReleaseMetrics:
    """Requests and TTFT per release role, shares, shadow outcomes and rollbacks."""

    def __init__(self, registry: CollectorRegistry, models: Iterable[str] = ()) -> None:
        r = registry
        self.requests = Counter(
            "inhouse:gateway_release_requests",
            "Requests answered, by model, release role and HTTP status class.",
            ["model_name", "release", "status_class"],
            registry=r,
        )
        self.ttft = Histogram(
            "inhouse:gateway_release_time_to_first_token_seconds",
            "Request start to first content chunk, by release role (streams).",
            ["model_name", "release"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.info = Gauge(
            "inhouse:gateway_release_info",
            "1 for the release number that holds each role of a model.",
            ["model_name", "role", "number"],
            registry=r,
        )
        self.share = Gauge(
            "inhouse:gateway_release_share_percent",
            "The candidate's canary and shadow shares.",
            ["model_name", "kind"],
            registry=r,
        )
        self.shadow = Counter(
            "inhouse:gateway_shadow_requests",
            "Mirrored requests by outcome (dropped: over the in-flight bound).",
            ["model_name", "outcome"],
            registry=r,
        )
        self.rollbacks = Counter(
            "inhouse:gateway_release_rollbacks",
            "Candidates rolled back by the guardrail, by the threshold crossed.",
            ["model_name", "reason"],
            registry=r,
        )
        self._shown: dict[str, dict[str, str]] = {}
        for model in models:  # 0 from the start, so `increase()` sees the first rollback
            for reason in ROLLBACK_REASONS:
                self.rollbacks.labels(model, reason)

    def observe(self, model: str, candidate: bool, status: int, ttft_s: float | None) -> None:
        """Count one answered request of a model that has releases."""
        role = ROLES[candidate]
        self.requests.labels(model, role, f"{status // 100}xx").inc()
        if ttft_s is not None:
            self.ttft.labels(model, role).observe(ttft_s)

    def show(self, state: ReleaseState) -> None:
        """Export which releases hold the roles and the shares (on each state change)."""
        numbers = {"stable": str(state.stable)}
        if state.candidate is not None:
            numbers["candidate"] = str(state.candidate)
        for role, number in self._shown.get(state.model, {}).items():
            if numbers.get(role) != number:
                self.info.remove(state.model, role, number)
        for role, number in numbers.items():
            self.info.labels(state.model, role, number).set(1)
        self._shown[state.model] = numbers
        self.share.labels(state.model, "canary").set(state.percent)
        self.share.labels(state.model, "shadow").set(state.shadow)
        for outcome in SHADOW_OUTCOMES:  # 0, not "no data", before the first one
            self.shadow.labels(state.model, outcome)
