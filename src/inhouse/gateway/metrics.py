"""Prometheus metrics of the gateway, in their own registry (no process globals)."""

from __future__ import annotations

import hashlib
import re
from collections import deque
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from inhouse.gateway import metric_names as names
from inhouse.gateway.backends import Backend, BackendState
from inhouse.gateway.keys import valid_key_name
from inhouse.gateway.usage.teams import Team

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_OUTSIDE_KEY_NAMES = re.compile(r"[^A-Za-z0-9._@-]")


def key_label(name: str) -> str:
    """A key name as a metric label: itself when it keeps to the key-name rule (every key
    created since the rule), else its allowed characters with `_` for the others and a
    short hash of the whole name, so that an older name holding a newline or a right-to-left
    override shows as plain ASCII and stays apart from every other key."""
    if not name or valid_key_name(name):  # "": no key (a refusal before authentication)
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{_OUTSIDE_KEY_NAMES.sub('_', name)[:48]}~{digest}"


class GatewayMetrics:
    """Per-key and per-model counters, latency histograms, backend health, queue depth,
    and the mean prompt length over the last N requests (context creep)."""

    def __init__(self, creep_window: int, models: Iterable[str] = ()) -> None:
        self.registry = CollectorRegistry()
        self._most_replicas: dict[str, int] = {}  # MAX by autoscaled model
        r = self.registry
        self.requests = Counter(
            "inhouse:gateway_requests",
            "Requests answered, by key, model and HTTP status.",
            ["key_name", "model_name", "status"],
            registry=r,
        )
        self.tokens = Counter(
            "inhouse:gateway_tokens",
            "Tokens charged, by key, model and kind (prompt/completion).",
            ["key_name", "model_name", "kind"],
            registry=r,
        )
        self.rejections = Counter(
            "inhouse:gateway_rejections",
            "Requests refused at the gateway, by reason.",
            ["key_name", "model_name", "reason"],
            registry=r,
        )
        self.latency = Histogram(
            "inhouse:gateway_e2e_request_latency_seconds",
            "Request start to last byte, through the gateway.",
            ["model_name"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "inhouse:gateway_time_to_first_token_seconds",
            "Request start to first content chunk (streams).",
            ["model_name"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.fallbacks = Counter(
            "inhouse:gateway_fallbacks", "Requests sent to a fallback.", ["model_name"], registry=r
        )
        self.prefix_routed = Counter(
            "inhouse:gateway_prefix_routed",
            "Requests sent to the replica that was sent their prompt's prefix before "
            "(within the load slack), not the least-loaded one's pick.",
            ["model_name"],
            registry=r,
        )
        self.degraded = Counter(
            "inhouse:gateway_degraded",
            "Interactive requests answered by the model's smaller `degrade_to` model.",
            ["model_name"],
            registry=r,
        )
        self.queue_depth = Gauge(
            names.QUEUE_DEPTH,
            "Requests waiting for a replica.",
            ["model_name"],
            registry=r,
        )
        self.backend_state = Gauge(  # a state set: 1 for the backend's state, 0 for the rest
            "inhouse:gateway_backend_state",
            "Health of each backend replica: 1 on its current state.",
            ["model_name", "backend", "state"],
            registry=r,
        )
        self.backend_in_flight = Gauge(
            "inhouse:gateway_backend_in_flight",
            "Requests in flight per backend replica.",
            ["model_name", "backend"],
            registry=r,
        )
        self.mean_prompt_tokens = Gauge(
            "inhouse:gateway_mean_prompt_tokens",
            "Mean prompt tokens the backends reported over the last N requests (context creep).",
            ["model_name"],
            registry=r,
        )
        self.replicas = Gauge(
            names.REPLICAS,
            "Replicas of each model the gateway routes to (not counting those draining).",
            ["model_name"],
            registry=r,
        )
        self.replicas_max = Gauge(
            names.REPLICAS_MAX,
            "The most replicas `inhouse up --replicas MIN:MAX` may run of a model (its MAX).",
            ["model_name"],
            registry=r,
        )
        self.scale_events = Counter(
            names.SCALE_EVENTS,
            "Replicas started (up) or drained (down) by the autoscaler, by the signal why.",
            ["model_name", "direction", "reason"],
            registry=r,
        )
        self.team_budget = Gauge(
            "inhouse:gateway_team_budget_used_ratio",
            "Share of each team's token quota or money budget its period has used (1 = spent).",
            ["team", "budget"],
            registry=r,
        )
        self._creep: dict[str, _Window] = {}
        self._creep_window = creep_window
        self._children: dict[tuple[str, str, int], tuple[Any, Any, Any, Any, Any]] = {}
        self._models = frozenset(models)
        for model in self._models:  # a model without fallbacks yet exports 0, not "no data"
            self.fallbacks.labels(model)
            self.degraded.labels(model)
            self.queue_depth.labels(model)

    def refused(self, key: str, model: str | None, status: int, reason: str) -> None:
        """Count a request refused before admission. A model the gateway does not serve is
        labelled "": a client's made-up names never become series."""
        model_label = model if model in self._models else ""
        self.rejections.labels(key_label(key), model_label, reason).inc()
        self.requests.labels(key_label(key), model_label, str(status)).inc()

    def failed(self, key: str, model: str, reason: str) -> None:
        """Count an admitted request the gateway answered with an error."""
        self.rejections.labels(key_label(key), model, reason).inc()

    def observe_request(
        self,
        key: str,
        model: str,
        status: int,
        tokens: tuple[int, int],
        latency_s: float,
        ttft_s: float | None,
    ) -> None:
        """Count one answered request: its status, prompt/completion tokens and timings."""
        children = self._children.get((key, model, status))
        if children is None:  # `labels()` costs more than the update itself: look up once
            label = key_label(key)
            children = self._children[(key, model, status)] = (
                self.requests.labels(label, model, str(status)),
                self.tokens.labels(label, model, "prompt"),
                self.tokens.labels(label, model, "completion"),
                self.latency.labels(model),
                self.ttft.labels(model),
            )
        requests, prompt, completion, latency, ttft = children
        requests.inc()
        prompt.inc(tokens[0])
        completion.inc(tokens[1])
        latency.observe(latency_s)
        if ttft_s is not None:
            ttft.observe(ttft_s)

    def observe_prompt(self, model: str, prompt_tokens: int) -> None:
        """Add a request's prompt tokens (the backend's usage) to the model's last-N mean."""
        creep = self._creep.get(model)
        if creep is None:
            gauge = self.mean_prompt_tokens.labels(model)
            creep = self._creep[model] = _Window(self._creep_window, gauge)
        creep.add(prompt_tokens)

    def autoscaling(self, model: str, most: int) -> None:
        """`model`'s replicas are scaled between a MIN and `most`."""
        self._most_replicas[model] = most

    def observe_replicas(self, model: str, replicas: int) -> None:
        """The replica count routed to, its MAX (a fixed count is its own), and a 0 for every
        scale event not seen yet (a panel shows 0, not "no data")."""
        self.replicas.labels(model).set(replicas)
        self.replicas_max.labels(model).set(self._most_replicas.get(model, replicas))
        for direction, reason in names.SCALE_REASONS:
            self.scale_events.labels(model, direction, reason)

    def observe_backends(self, backends: list[Backend]) -> None:
        for b in backends:
            for state in BackendState:
                self.backend_state.labels(b.model, b.upstream.name, state.value).set(
                    state is b.state
                )
            self.backend_in_flight.labels(b.model, b.upstream.name).set(b.in_flight)

    def ttft_buckets(self, model: str) -> list[tuple[float, float]]:
        """The model's time-to-first-token histogram as (upper bound, cumulative count)."""
        return [
            (float(sample.labels["le"]), sample.value)
            for family in self.ttft.collect()
            for sample in family.samples
            if sample.name.endswith("_bucket") and sample.labels["model_name"] == model
        ]

    def observe_teams(self, teams: Iterable[Team], now: float) -> None:
        """Set each team's used share of its quota ("tokens") and budget ("money")."""
        self.team_budget.clear()
        for team in teams:
            for budget, ratio in team.ratios(now).items():
                self.team_budget.labels(team.name, budget).set(ratio)

    def exposition(self) -> bytes:
        """The Prometheus text exposition for ``GET /metrics``."""
        return generate_latest(self.registry)


class _Window:
    """The mean of the last N values, kept with a running sum and shown on a gauge."""

    def __init__(self, size: int, gauge: Any) -> None:
        self._values: deque[int] = deque(maxlen=size)
        self._sum = 0
        self._gauge = gauge

    def add(self, value: int) -> None:
        if len(self._values) == self._values.maxlen:
            self._sum -= self._values[0]
        self._values.append(value)
        self._sum += value
        self._gauge.set(self._sum / len(self._values))


def scrape_targets(backends: Iterable[Backend]) -> list[dict[str, Any]]:
    """Prometheus HTTP-SD target groups: one per backend URL that exports /metrics.

    A replica serving two public models (chat and embeddings) is listed once; its label
    ``backend`` is the name the gateway gives it.
    """
    groups: dict[str, dict[str, Any]] = {}
    for b in backends:
        if not b.upstream.scraped:  # hosted APIs: no /metrics of ours to read
            continue
        url = urlsplit(b.upstream.url)
        key = f"{url.scheme}://{url.netloc}{url.path}"
        groups.setdefault(
            key,
            {
                "targets": [url.netloc],
                "labels": {
                    "__scheme__": url.scheme or "http",
                    "__metrics_path__": url.path.rstrip("/") + "/metrics",
                    "backend": b.upstream.name,
                    "engine": b.upstream.kind,
                },
            },
        )
    return list(groups.values())
