"""Prometheus metrics of the gateway, in their own registry (no process globals)."""

from __future__ import annotations

from collections import deque

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram, generate_latest

from inhouse.gateway.backends import Backend, BackendState

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class GatewayMetrics:
    """Per-key and per-model counters, latency histograms, backend health, queue depth,
    and the mean prompt length over the last N requests (context creep)."""

    def __init__(self, creep_window: int) -> None:
        self.registry = CollectorRegistry()
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
        self.queue_depth = Gauge(
            "inhouse:gateway_queue_depth",
            "Requests waiting for a replica.",
            ["model_name"],
            registry=r,
        )
        self.backend_state = Enum(
            "inhouse:gateway_backend_state",
            "Health of each backend replica.",
            ["model_name", "backend"],
            states=[s.value for s in BackendState],
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
            "Mean prompt tokens over the last N requests (alert on context creep).",
            ["model_name"],
            registry=r,
        )
        self._recent_prompts: dict[str, deque[int]] = {}
        self._creep_window = creep_window

    def observe_prompt(self, model: str, prompt_tokens: int) -> None:
        window = self._recent_prompts.setdefault(model, deque(maxlen=self._creep_window))
        window.append(prompt_tokens)
        self.mean_prompt_tokens.labels(model).set(sum(window) / len(window))

    def observe_backends(self, backends: list[Backend]) -> None:
        for b in backends:
            self.backend_state.labels(b.model, b.upstream.name).state(b.state.value)
            self.backend_in_flight.labels(b.model, b.upstream.name).set(b.in_flight)

    def render(self) -> bytes:
        return generate_latest(self.registry)
