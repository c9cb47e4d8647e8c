"""The Grafana dashboard, built from a list of panels and their PromQL.

Per model (``$model``), backend (``$backend``) and key (``$key``); engine panels read our
metric names or vLLM's, gateway panels the gateway's. Recording rules from
:mod:`inhouse.observe.rules` (``model:…``) are used where an alert watches the same number,
so the dashboard shows exactly what the alert compares.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inhouse.gateway import metric_names as gateway_names
from inhouse.launch import metric_names as names
from inhouse.observe.rules import ENGINE_PREFIX, ITL

RATE = "$__rate_interval"
MODEL = 'model_name=~"$model"'
UID = "inhouse"
UP = 'state="up"'
GATEWAY = "inhouse:gateway_"


def rate(metric: str, matchers: str) -> str:
    """``rate(metric{matchers}[$__rate_interval])``."""
    return f"rate({metric}{{{matchers}}}[{RATE}])"


def engine(name: str, extra: str = MODEL) -> str:
    """Selector for an engine metric (ours or vLLM's), filtered to the chosen models."""
    return f'{{__name__=~"{ENGINE_PREFIX}:{name}", {extra}}}'


def quantiles(bucket_selector: str, by: str = "") -> list[tuple[str, str]]:
    """p50 and p99 of a histogram, as (expr, legend) pairs."""
    group = f"le{', ' + by if by else ''}"
    legend = f"{{{{{by}}}}} " if by else ""
    return [
        (
            f"histogram_quantile({q}, sum by ({group}) (rate({bucket_selector}[{RATE}])))",
            f"{legend}p{int(q * 100)}",
        )
        for q in (0.5, 0.99)
    ]


@dataclass(frozen=True, slots=True)
class Panel:
    """One time-series panel: a title, its queries (expr, legend) and the unit."""

    title: str
    queries: list[tuple[str, str]]
    unit: str = "short"
    description: str = ""


@dataclass(frozen=True, slots=True)
class Row:
    title: str
    panels: list[Panel] = field(default_factory=list)


def rows() -> list[Row]:
    """Every row and panel of the dashboard."""
    requests = f"inhouse:gateway_requests_total{{{MODEL}}}"
    gw_ttft = f"inhouse:gateway_time_to_first_token_seconds_bucket{{{MODEL}}}"
    gw_e2e = f"inhouse:gateway_e2e_request_latency_seconds_bucket{{{MODEL}}}"
    backend = f'{MODEL}, backend=~"$backend"'
    key = f'{MODEL}, key_name=~"$key"'
    return [
        Row(
            "Traffic through the gateway",
            [
                Panel(
                    "Requests by status",
                    [(f"sum by (status) (rate({requests}[{RATE}]))", "{{status}}")],
                    "reqps",
                ),
                Panel(
                    "Errors, 503 and 429 (share of requests)",
                    [
                        (f"model:gateway_error:ratio{{{MODEL}}}", "5xx {{model_name}}"),
                        (f"model:gateway_unavailable:ratio{{{MODEL}}}", "503 {{model_name}}"),
                        (f"model:gateway_rate_limited:ratio{{{MODEL}}}", "429 {{model_name}}"),
                    ],
                    "percentunit",
                ),
                Panel("Time to first token, gateway", quantiles(gw_ttft), "s"),
                Panel("End to end, gateway", quantiles(gw_e2e), "s"),
            ],
        ),
        Row(
            "Engine latency and throughput",
            [
                Panel(
                    "Time to first token, engine",
                    quantiles(engine(f"{names.TTFT}_bucket"), "model_name"),
                    "s",
                    "The alert compares model:time_to_first_token_seconds:p99 with the SLO.",
                ),
                Panel(
                    "Inter-token latency",
                    quantiles(engine(f"{ITL}_bucket"), "model_name"),
                    "s",
                ),
                Panel(
                    "End to end, engine",
                    quantiles(engine(f"{names.E2E}_bucket"), "model_name"),
                    "s",
                ),
                Panel(
                    "Tokens per second",
                    [
                        (
                            f"sum(rate({engine(names.PROMPT_TOKENS + '_total')}[{RATE}]))",
                            "prompt (in)",
                        ),
                        (
                            f"sum(rate({engine(names.GENERATION_TOKENS + '_total')}[{RATE}]))",
                            "generated (out)",
                        ),
                    ],
                    "short",
                ),
            ],
        ),
        Row(
            "Engine capacity",
            [
                Panel(
                    "Running and waiting requests",
                    [
                        (
                            f"sum by (instance) ({engine(names.RUNNING)})",
                            "running {{instance}}",
                        ),
                        (
                            f"sum by (instance) ({engine(names.WAITING)})",
                            "waiting {{instance}}",
                        ),
                    ],
                ),
                Panel(
                    "KV cache usage",
                    [(f"model:kv_cache_usage:ratio{{{MODEL}}}", "{{instance}}")],
                    "percentunit",
                ),
                Panel(
                    "Prefix cache hit rate",
                    [
                        (
                            f"sum(rate({engine(names.PREFIX_HITS + '_total')}[{RATE}]))\n"
                            f"/ sum(rate({engine(names.PREFIX_QUERIES + '_total')}[{RATE}]))",
                            "hit rate",
                        )
                    ],
                    "percentunit",
                ),
                Panel(
                    "Preemptions per second",
                    [
                        (
                            "sum by (instance) "
                            f"(rate({engine(names.PREEMPTIONS + '_total')}[{RATE}]))",
                            "{{instance}}",
                        )
                    ],
                ),
            ],
        ),
        Row(
            "Backends",
            [
                Panel(
                    "Backend health (1 = up)",
                    [
                        (
                            f"max by (backend) (inhouse:gateway_backend_state{{{backend}, {UP}}})",
                            "{{backend}}",
                        )
                    ],
                ),
                Panel(
                    "In flight per backend",
                    [
                        (
                            f"sum by (backend) (inhouse:gateway_backend_in_flight{{{backend}}})",
                            "{{backend}}",
                        )
                    ],
                ),
                Panel(
                    "Replicas and scale events",
                    [
                        (
                            f"max by (model_name) ({gateway_names.REPLICAS}{{{MODEL}}})",
                            "replicas {{model_name}}",
                        ),
                        (
                            f"max by (model_name) ({gateway_names.REPLICAS_MAX}{{{MODEL}}})",
                            "max {{model_name}}",
                        ),
                        (
                            "sum by (model_name, direction, reason) "
                            f"(increase({gateway_names.SCALE_EVENTS}_total{{{MODEL}}}[{RATE}]))",
                            "{{direction}} ({{reason}}) {{model_name}}",
                        ),
                    ],
                    description="`inhouse up --replicas MIN:MAX`: replicas routed to, the MAX, "
                    "and each replica started (up) or drained (down) with the signal why.",
                ),
                Panel(
                    "Queue depth and fallbacks",
                    [
                        (
                            f"sum by (model_name) (inhouse:gateway_queue_depth{{{MODEL}}})",
                            "queued {{model_name}}",
                        ),
                        (
                            f"sum by (model_name) ({rate(GATEWAY + 'fallbacks_total', MODEL)})",
                            "fallbacks/s {{model_name}}",
                        ),
                    ],
                ),
            ],
        ),
        Row(
            "Keys and context",
            [
                Panel(
                    "Tokens per key",
                    [
                        (
                            f"sum by (key_name, kind) ({rate(GATEWAY + 'tokens_total', key)})",
                            "{{key_name}} {{kind}}",
                        )
                    ],
                ),
                Panel(
                    "Rejections per key and reason",
                    [
                        (
                            f"sum by (key_name, reason) "
                            f"({rate(GATEWAY + 'rejections_total', key)})",
                            "{{key_name}} {{reason}}",
                        )
                    ],
                    "reqps",
                ),
                Panel(
                    "Context creep: mean prompt tokens per request",
                    [
                        (
                            f"model:prompt_tokens_per_request:mean{{{MODEL}}}",
                            "recent {{model_name}}",
                        ),
                        (
                            f"model:prompt_tokens_per_request:baseline{{{MODEL}}}",
                            "baseline {{model_name}}",
                        ),
                        (
                            f"inhouse:gateway_mean_prompt_tokens{{{MODEL}}}",
                            "last N requests {{model_name}}",
                        ),
                    ],
                ),
            ],
        ),
    ]


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "current": {"text": "All", "value": "$__all"},
        "refresh": 2,
        "sort": 1,
    }


def _panel(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    return {
        "id": panel_id,
        "type": "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 6, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(panel.queries)
        ],
    }


def dashboard() -> dict[str, Any]:
    """The dashboard JSON Grafana imports (Dashboards → New → Import)."""
    panels: list[dict[str, Any]] = []
    y = 0
    for row in rows():
        panels.append(
            {
                "id": len(panels) + 1,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        y += 1
        for i, panel in enumerate(row.panels):
            panels.append(_panel(panel, len(panels) + 1, x=6 * (i % 4), y=y + 8 * (i // 4)))
        y += 8 * -(-len(row.panels) // 4)
    return {
        "uid": UID,
        "title": "inhouse",
        "description": "The inhouse gateway and its engines (ours or vLLM): traffic, latency,"
        " capacity, keys.",
        "tags": ["inhouse", "llm"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "timezone": "browser",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                },
                _variable(
                    "model", "Model", "label_values(inhouse:gateway_requests_total, model_name)"
                ),
                _variable(
                    "backend", "Backend", "label_values(inhouse:gateway_backend_in_flight, backend)"
                ),
                _variable("key", "Key", "label_values(inhouse:gateway_tokens_total, key_name)"),
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def queries() -> list[str]:
    """Every PromQL expression of the dashboard, for tests and `promtool`."""
    return [expr for row in rows() for panel in row.panels for expr, _ in panel.queries]
