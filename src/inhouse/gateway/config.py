"""Gateway configuration: models, their backends and policies (read from TOML by `config_file`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from inhouse.cost.settings import CostSettings
from inhouse.gateway.config_values import (
    DEFAULT_BATCH_FREE_REPLICAS,
    DEFAULT_INTERACTIVE_SEATS,
    DEFAULT_PREFIX_SLACK,
    DEFAULT_QUEUE_WAIT_S,
    KEEP_ALIVE_S,
    ConfigError,
)
from inhouse.http.body_limit import IMAGE_BODY_BYTES
from inhouse.launch import BACKENDS
from inhouse.plan.vision import DEFAULT_IMAGES_PER_PROMPT  # one limit: the plan's, vLLM's, ours

DEFAULT_HOLD_TTL_S = 30.0  # see `holds`
CAPABILITIES = frozenset({"chat", "completions", "embeddings", "tools", "json_schema", "vision"})
POLICIES = ("queue", "fallback", "degrade")
ROUTINGS = ("prefix", "least-loaded")  # how a replica is picked (`affinity`, `routing`)


def default_state_dir() -> Path:
    """Where the gateway keeps its database and pepper unless told otherwise."""
    return Path(os.environ.get("INHOUSE_HOME", Path.home() / ".inhouse"))


def default_database_url() -> str:
    """SQLite file in the state directory."""
    return f"sqlite:///{default_state_dir() / 'gateway.db'}"


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a backend can serve; requests needing more are refused with 400."""

    features: frozenset[str] = frozenset({"chat", "completions"})
    max_context: int | None = None
    max_output: int | None = None

    def supports(self, feature: str) -> bool:
        return feature in self.features


@dataclass(frozen=True, slots=True)
class Upstream:
    """An OpenAI-compatible endpoint: a replica or a fallback."""

    name: str
    url: str
    api_key: str | None
    model: str
    kind: str = "inhouse"
    weight: float = 1.0
    max_in_flight: int = 64
    max_num_seqs: int | None = None  # sequences its engine runs at once, where known (`seats`)
    capabilities: Capabilities = field(default_factory=Capabilities)
    send_priority: bool = True  # vLLM refuses priority != 0 without --scheduling-policy priority
    adapters: frozenset[str] = frozenset()  # LoRA adapters it serves at start (`adapters`)

    @property
    def saltable(self) -> bool:
        return BACKENDS[self.kind].saltable

    @property
    def tokenizes(self) -> bool:
        """Its `/tokenize` answers a prompt's token count (see tokens.count_prompt)."""
        return BACKENDS[self.kind].tokenizes

    @property
    def scraped(self) -> bool:
        """The router reads its `/metrics` for load (see backends.read_load)."""
        return BACKENDS[self.kind].metrics is not None

    @property
    def prioritized(self) -> bool:
        return self.send_priority and BACKENDS[self.kind].prioritized


@dataclass(frozen=True, slots=True)
class ModelRoute:
    """A public model name, the replicas behind it and its overload/outage policy."""

    name: str
    backends: tuple[Upstream, ...]
    fallback: Upstream | None = None
    policy: Literal["queue", "fallback", "degrade"] = "queue"
    allow_fallback: bool = True
    queue_max_depth: int = 64
    queue_max_wait_s: float = DEFAULT_QUEUE_WAIT_S  # the default class's (and unnamed ones')
    default_max_tokens: int = 1024
    class_max_wait_s: tuple[tuple[str, float], ...] = ()  # per priority class, where set
    degrade_to: str | None = None  # policy "degrade": the smaller model interactive work takes
    degrade_after_s: float = 1.0  # ... when the expected wait here exceeds this
    interactive_seats: int = DEFAULT_INTERACTIVE_SEATS  # of each replica's max_num_seqs
    batch_free_replicas: int = DEFAULT_BATCH_FREE_REPLICAS  # `seats.batch_free`
    routing: Literal["prefix", "least-loaded"] = "prefix"
    prefix_slack: int = DEFAULT_PREFIX_SLACK  # requests above the least-loaded (`affinity`)
    images_per_prompt: int = DEFAULT_IMAGES_PER_PROMPT  # image parts a request may hold

    def max_wait(self, priority: str) -> float:
        """How long a request of class `priority` may wait in this model's queue."""
        return dict(self.class_max_wait_s).get(priority, self.queue_max_wait_s)

    @property
    def adapters(self) -> frozenset[str]:
        """The LoRA adapters of this base model its replicas and fallback declare."""
        upstreams = (*self.backends, *(() if self.fallback is None else (self.fallback,)))
        return frozenset().union(*(u.adapters for u in upstreams))

    def limit(self, name: Literal["max_context", "max_output"]) -> int | None:
        """The smallest context or output limit its replicas declare, if any declares one."""
        values = [getattr(b.capabilities, name) for b in self.backends]
        known = [v for v in values if v is not None]
        return min(known) if known else None


@dataclass(frozen=True, slots=True)
class HealthSettings:
    interval_s: float = 10.0
    timeout_s: float = 5.0
    failures_to_down: int = 3
    successes_to_up: int = 1


@dataclass(frozen=True, slots=True)
class AuditSettings:
    flush_interval_s: float = 0.5
    batch_size: int = 200
    redact: tuple[str, ...] = ()
    creep_window: int = 100
    journal_dir: Path | None = None


@dataclass(frozen=True, slots=True)
class ReleaseSettings:
    """`[releases]`: the shadow's bounds and how often the guardrail looks (see `shadow`,
    `guardrail`)."""

    shadow_max_in_flight: int = 16
    shadow_timeout_s: float = 60.0
    guard_interval_s: float = 10.0

    def __post_init__(self) -> None:
        if self.shadow_max_in_flight < 0 or self.shadow_timeout_s <= 0:
            raise ConfigError("releases: shadow_max_in_flight >= 0 and shadow_timeout_s > 0")
        if self.guard_interval_s <= 0:
            raise ConfigError("releases.guard_interval_s must be > 0")


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Everything `inhouse gateway` needs; see README "## Gateway" for each key."""

    models: tuple[ModelRoute, ...]
    host: str = "127.0.0.1"
    port: int = 8000
    database: str = field(default_factory=default_database_url)
    pepper_file: Path | None = None
    shared_limits: bool = False
    hold_ttl_s: float = DEFAULT_HOLD_TTL_S  # how long a dead gateway's holds outlive it
    request_timeout_s: float = 600.0
    drain_timeout_s: float = 30.0
    keep_alive_s: float = KEEP_ALIVE_S
    access_log: bool = True
    max_request_body: int = IMAGE_BODY_BYTES
    metrics_token: str | None = None  # from $`metrics_token_env`; None: /metrics is public
    trusted_proxies: tuple[str, ...] = ()  # addresses/networks whose X-Forwarded-For counts
    image_url_hosts: frozenset[str] = frozenset()  # hosts an http(s) image URL may name
    health: HealthSettings = field(default_factory=HealthSettings)
    audit: AuditSettings = field(default_factory=AuditSettings)
    releases: ReleaseSettings = field(default_factory=ReleaseSettings)
    cost: CostSettings = field(default_factory=CostSettings)  # [cost]: see inhouse.cost

    def model(self, name: str) -> ModelRoute | None:
        return next((m for m in self.models if m.name == name), None)

    def held_secrets(self) -> list[str]:
        """The secrets this config gives the gateway: every backend's and fallback's key,
        and the metrics token (the audit's redactor hides each of them)."""
        upstreams = [u for m in self.models for u in (*m.backends, m.fallback) if u is not None]
        held = [u.api_key for u in upstreams if u.api_key]
        return held + ([self.metrics_token] if self.metrics_token else [])
