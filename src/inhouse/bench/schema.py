"""The results file's schema (JSON Schema draft 2020-12). Version 1; additions only within it.

Times are seconds. `runs[].requests[]` holds every measured request: `start` is seconds since
the run began; `ttft`, `e2e` and `chunk_times` are seconds since that request's start.
A mixed run (`kind` "mix", `inhouse bench run --mix`) holds one run per class, each naming
its `class`.
"""

from __future__ import annotations

from typing import Any

SCHEMA_VERSION = 1

_NUM = {"type": ["number", "null"]}
_INT = {"type": ["integer", "null"]}
_STR = {"type": ["string", "null"]}

_DISTRIBUTION = {
    "type": "object",
    "required": ["count", "mean", "p50", "p90", "p95", "p99", "max"],
    "properties": {"count": {"type": "integer"}}
    | {key: _NUM for key in ("mean", "p50", "p90", "p95", "p99", "max")},
}

_SUMMARY = {
    "type": "object",
    "required": [
        "completed",
        "failed",
        "failures",
        "duration",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "goodput",
        "slo_met",
        "token_sources",
        "ttft",
        "tpot",
        "itl",
        "e2e",
    ],
    "properties": {
        "completed": {"type": "integer"},
        "failed": {"type": "integer"},
        "failures": {"type": "object", "additionalProperties": {"type": "integer"}},
        "duration": {"type": "number"},
        "goodput": _NUM,
        "slo_met": _INT,
        "token_sources": {"type": "object", "additionalProperties": {"type": "integer"}},
    }
    | {name: _DISTRIBUTION for name in ("ttft", "tpot", "itl", "e2e")},
}

_REQUEST = {
    "type": "object",
    "required": [
        "index",
        "start",
        "status",
        "error",
        "ok",
        "outcome",
        "ttft",
        "tpot",
        "e2e",
        "chunk_times",
        "prompt_tokens",
        "output_tokens",
        "token_source",
        "finish_reason",
    ],
    "properties": {
        "index": {"type": "integer"},
        "start": {"type": "number"},
        "status": _INT,
        "error": _STR,
        "ok": {"type": "boolean"},
        "outcome": {"type": "string"},
        "ttft": _NUM,
        "tpot": _NUM,
        "e2e": _NUM,
        "chunk_times": {"type": "array", "items": {"type": "number"}},
        "prompt_tokens": _INT,
        "output_tokens": _INT,
        "token_source": {"enum": ["usage", "tokenize", "chunks", None]},
        "finish_reason": _STR,
    },
}

_CLASS = {
    "type": "object",
    "required": ["name", "max_concurrency", "input_len", "output_len", "background", "priority"],
    "properties": {
        "name": {"type": "string"},
        "max_concurrency": {"type": "integer"},
        "background": {"type": "boolean"},
        "priority": _INT,
    },
}

_RUN = {
    "type": "object",
    "required": ["max_concurrency", "request_rate", "summary", "server_metrics", "requests"],
    "properties": {
        "class": _CLASS,
        "max_concurrency": _INT,
        "request_rate": _NUM,
        "summary": _SUMMARY,
        "server_metrics": {
            "type": "object",
            "required": [
                "samples",
                "kv_cache_usage_peak",
                "waiting_peak",
                "running_peak",
                "prefix_cache_hit_rate",
                "preemptions",
            ],
        },
        "notes": {"type": "array", "items": {"type": "string"}},
        "requests": {"type": "array", "items": _REQUEST},
    },
}

_VERDICT = {
    "type": "object",
    "required": [
        "knee",
        "last_within_slo",
        "highest_tested",
        "predicted_max_concurrency",
        "knee_over_predicted",
        "sentence",
    ],
    "properties": {
        "knee": _INT,
        "last_within_slo": _INT,
        "highest_tested": {"type": "integer"},
        "predicted_max_concurrency": _NUM,
        "knee_over_predicted": _NUM,
        "sentence": {"type": "string"},
    },
}

RESULTS_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "inhouse bench results",
    "type": "object",
    "required": ["schema_version", "kind", "created", "config", "notes", "runs", "sweep"],
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "kind": {"enum": ["run", "sweep", "mix"]},
        "created": {"type": "string"},
        "config": {"type": "object", "required": ["base_url", "model", "dataset", "slo"]},
        "notes": {"type": "array", "items": {"type": "string"}},
        "runs": {"type": "array", "items": _RUN, "minItems": 1},
        "sweep": {"oneOf": [{"type": "null"}, _VERDICT]},
    },
}
