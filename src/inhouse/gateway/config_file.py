"""Reading a gateway TOML file into a :class:`~inhouse.gateway.config.GatewayConfig`: every
table and key checked, unknown ones refused with where they are."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from inhouse.cost.settings import CostConfigError, CostSettings, parse_cost
from inhouse.gateway import config_values
from inhouse.gateway.config import (
    CAPABILITIES,
    DEFAULT_HOLD_TTL_S,
    POLICIES,
    ROUTINGS,
    AuditSettings,
    Capabilities,
    GatewayConfig,
    HealthSettings,
    ModelRoute,
    ReleaseSettings,
    Upstream,
    default_database_url,
)
from inhouse.gateway.config_values import (
    DEFAULT_INTERACTIVE_SEATS,
    DEFAULT_PREFIX_SLACK,
    DEFAULT_QUEUE_WAIT_S,
    KEEP_ALIVE_S,
    ConfigError,
    env_secret,
    name_list,
    networks,
    non_negative_int,
    optional_int,
    owned_once,
    positive_int,
    queue_waits,
    reject_unknown,
    seconds,
)
from inhouse.http.body_limit import IMAGE_BODY_BYTES
from inhouse.launch import BACKENDS
from inhouse.plan.vision import DEFAULT_IMAGES_PER_PROMPT  # one limit: the plan's, vLLM's, ours


def load_config(path: str | Path) -> GatewayConfig:
    """Read and validate a gateway TOML file."""
    with open(path, "rb") as f:
        return parse_config(tomllib.load(f))


def parse_config(data: dict[str, Any]) -> GatewayConfig:
    """Validate a parsed TOML document into a GatewayConfig."""
    gw = _table(data, "gateway")
    reject_unknown(gw, "gateway", GATEWAY_KEYS)
    models = tuple(_model(m, i) for i, m in enumerate(data.get("models", [])))
    if not models:
        raise ConfigError("at least one [[models]] entry is required")
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise ConfigError(f"model names must be unique, got {names}")
    owned_once({m.name: m.adapters for m in models}, names, "adapter")
    for m in models:
        if m.degrade_to is not None and (m.degrade_to not in names or m.degrade_to == m.name):
            raise ConfigError(
                f"model {m.name!r}: degrade_to must name another [[models]] entry,"
                f" got {m.degrade_to!r}"
            )
    health = _table(data, "health")
    reject_unknown(health, "health", {f.name for f in HealthSettings.__dataclass_fields__.values()})
    audit = _table(data, "audit")
    reject_unknown(audit, "audit", {f.name for f in AuditSettings.__dataclass_fields__.values()})
    release = _table(data, "releases")
    reject_unknown(
        release, "releases", {f.name for f in ReleaseSettings.__dataclass_fields__.values()}
    )
    pepper = gw.get("pepper_file")
    return GatewayConfig(
        models=models,
        host=str(gw.get("host", "127.0.0.1")),
        port=int(gw.get("port", 8000)),
        database=str(gw.get("database") or default_database_url()),
        pepper_file=Path(pepper) if pepper else None,
        shared_limits=bool(gw.get("shared_limits", False)),
        hold_ttl_s=_hold_ttl(gw.get("hold_ttl_s", DEFAULT_HOLD_TTL_S)),
        request_timeout_s=float(gw.get("request_timeout_s", 600.0)),
        drain_timeout_s=float(gw.get("drain_timeout_s", 30.0)),
        keep_alive_s=seconds(gw.get("keep_alive_s", KEEP_ALIVE_S), "gateway.keep_alive_s"),
        access_log=bool(gw.get("access_log", True)),
        max_request_body=positive_int(
            gw.get("max_request_body", IMAGE_BODY_BYTES), "gateway.max_request_body"
        ),
        metrics_token=env_secret(gw, "metrics_token_env", "gateway"),
        trusted_proxies=networks(gw.get("trusted_proxies", []), "gateway.trusted_proxies"),
        image_url_hosts=frozenset(
            h.lower() for h in name_list(gw.get("image_url_hosts", []), "gateway.image_url_hosts")
        ),
        health=HealthSettings(**health),
        audit=_audit_settings(audit),
        releases=ReleaseSettings(**release),
        cost=_cost(_table(data, "cost")),
    )


def _hold_ttl(value: Any) -> float:
    ttl = seconds(value, "gateway.hold_ttl_s")
    if ttl < 1:
        raise ConfigError(f"gateway.hold_ttl_s must be at least 1 second, got {value!r}")
    return ttl


GATEWAY_KEYS = {
    "host",
    "port",
    "database",
    "pepper_file",
    "shared_limits",
    "hold_ttl_s",
    "request_timeout_s",
    "drain_timeout_s",
    "keep_alive_s",
    "access_log",
    "max_request_body",
    "metrics_token_env",
    "trusted_proxies",
    "image_url_hosts",
}
MODEL_KEYS = {
    "name",
    "backends",
    "fallback",
    "policy",
    "allow_fallback",
    "queue_max_depth",
    "queue_max_wait_s",
    "default_max_tokens",
    "degrade_to",
    "degrade_after_s",
    "interactive_seats",
    "batch_free_replicas",
    "routing",
    "prefix_slack",
    "images_per_prompt",
}
UPSTREAM_KEYS = {
    "name",
    "url",
    "api_key",
    "api_key_env",
    "model",
    "kind",
    "weight",
    "max_in_flight",
    "max_num_seqs",
    "capabilities",
    "max_context",
    "max_output",
    "send_priority",
    "adapters",
}


def _table(data: dict[str, Any], key: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"[{key}] must be a table")
    return value


def _audit_settings(audit: dict[str, Any]) -> AuditSettings:
    journal = audit.get("journal_dir")
    return AuditSettings(
        **{
            **audit,
            "redact": tuple(audit.get("redact", ())),
            "journal_dir": Path(journal) if journal else None,
        }
    )


def _cost(raw: dict[str, Any]) -> CostSettings:
    try:
        return parse_cost(raw)
    except CostConfigError as err:
        raise ConfigError(str(err)) from None


def _model(raw: dict[str, Any], index: int) -> ModelRoute:
    where = f"models[{index}]"
    reject_unknown(raw, where, MODEL_KEYS)
    name = raw.get("name")
    if not name:
        raise ConfigError(f"{where}.name is required")
    backends = tuple(
        _upstream(b, f"{where}.backends[{i}]", name) for i, b in enumerate(raw.get("backends", []))
    )
    if not backends:
        raise ConfigError(f"{where} ({name}) needs at least one [[models.backends]]")
    fallback = _upstream(raw["fallback"], f"{where}.fallback", name) if "fallback" in raw else None
    policy = raw.get("policy", "queue")
    if policy not in POLICIES:
        raise ConfigError(f"{where}.policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if policy == "fallback" and fallback is None:
        raise ConfigError(f"{where}.policy = 'fallback' needs a [models.fallback] table")
    degrade_to = raw.get("degrade_to")
    if (policy == "degrade") != (degrade_to is not None) or not isinstance(degrade_to, str | None):
        raise ConfigError(f"{where}: policy = 'degrade' and degrade_to = '<model>' go together")
    depth = int(raw.get("queue_max_depth", 64))
    if depth < 0:
        raise ConfigError(f"{where}: queue_max_depth must be >= 0")
    wait, by_class = queue_waits(raw.get("queue_max_wait_s", DEFAULT_QUEUE_WAIT_S), where)
    seats = raw.get("interactive_seats", DEFAULT_INTERACTIVE_SEATS)
    routing = raw.get("routing", "prefix")
    if routing not in ROUTINGS:
        raise ConfigError(f"{where}.routing must be one of {', '.join(ROUTINGS)}, got {routing!r}")
    slack = raw.get("prefix_slack", DEFAULT_PREFIX_SLACK)
    return ModelRoute(
        name=name,
        backends=backends,
        fallback=fallback,
        policy=policy,
        allow_fallback=bool(raw.get("allow_fallback", True)),
        queue_max_depth=depth,
        queue_max_wait_s=wait,
        default_max_tokens=int(raw.get("default_max_tokens", 1024)),
        class_max_wait_s=by_class,
        degrade_to=degrade_to,
        degrade_after_s=seconds(raw.get("degrade_after_s", 1.0), f"{where}.degrade_after_s"),
        interactive_seats=non_negative_int(seats, f"{where}.interactive_seats"),
        batch_free_replicas=non_negative_int(
            raw.get("batch_free_replicas", config_values.DEFAULT_BATCH_FREE_REPLICAS),
            f"{where}.batch_free_replicas",
        ),
        routing=routing,
        prefix_slack=non_negative_int(slack, f"{where}.prefix_slack"),
        images_per_prompt=non_negative_int(
            raw.get("images_per_prompt", DEFAULT_IMAGES_PER_PROMPT), f"{where}.images_per_prompt"
        ),
    )


def _upstream(raw: dict[str, Any], where: str, model: str) -> Upstream:
    reject_unknown(raw, where, UPSTREAM_KEYS)
    url = str(raw.get("url", "")).rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{where}.url must be an http(s) URL, got {url!r}")
    kind = raw.get("kind", "inhouse")
    if kind not in BACKENDS:
        raise ConfigError(f"{where}.kind must be one of {sorted(BACKENDS)}, got {kind!r}")
    features = frozenset(raw.get("capabilities", ("chat", "completions")))
    if not features <= CAPABILITIES:
        bad = sorted(features - CAPABILITIES)
        raise ConfigError(f"{where}.capabilities: unknown {bad}; known {sorted(CAPABILITIES)}")
    api_key = raw.get("api_key")
    if "api_key_env" in raw:
        api_key = env_secret(raw, "api_key_env", where)
    weight = float(raw.get("weight", 1.0))
    if weight <= 0:
        raise ConfigError(f"{where}.weight must be > 0")
    seqs = raw.get("max_num_seqs")
    seqs = None if seqs is None else positive_int(seqs, f"{where}.max_num_seqs")
    send_priority = raw.get("send_priority", True)
    if not isinstance(send_priority, bool):
        raise ConfigError(f"{where}.send_priority must be true or false")
    return Upstream(
        name=str(raw.get("name") or parts.netloc),
        url=url,
        api_key=api_key,
        model=str(raw.get("model", model)),
        kind=kind,
        weight=weight,
        max_in_flight=int(raw.get("max_in_flight", 64)),
        max_num_seqs=seqs,
        capabilities=Capabilities(
            features=features,
            max_context=optional_int(raw.get("max_context")),
            max_output=optional_int(raw.get("max_output")),
        ),
        send_priority=send_priority,
        adapters=name_list(raw.get("adapters", []), f"{where}.adapters"),
    )
