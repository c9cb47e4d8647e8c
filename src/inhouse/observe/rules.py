"""Prometheus recording and alerting rules for the signals the seeds say to watch.

Engine-side rules match our names and vLLM's in one selector (``inhouse:…`` or ``vllm:…``,
and vLLM's older ``gpu_cache_usage_perc`` / ``time_per_output_token_seconds``), so the
same file serves a gateway in front of either. Gateway-side rules read the gateway's
own ``inhouse:gateway_*`` series. Thresholds come from :class:`AlertThresholds`: the
SLO (``--slo ttft=…,tpot=…``) and the plan's ``max_num_seqs`` where they apply.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import yaml

from inhouse.gateway import metric_names as gateway_names
from inhouse.launch import BACKENDS
from inhouse.launch import metric_names as names

# The prefixes of the engines that expose vLLM's names: ours and vLLM's.
ENGINE_PREFIX = "({})".format(
    "|".join(
        b.metrics.prefix.removesuffix(":")
        for b in BACKENDS.values()
        if b.metrics is not None and b.metrics.vllm_named
    )
)
BY_REPLICA = "job, instance, model_name"
KV_USAGE = f"({names.KV_USAGE}|{names.KV_USAGE_OLD})"  # vLLM's current name and its old one
ITL = f"({names.ITL}|{names.ITL_OLD})"  # the same for the inter-token latency histogram


# Every replica reports the same share (read from the shared database): one per team.
TEAM_BUDGET = "max by (team, budget) (inhouse:gateway_team_budget_used_ratio)"


def counted_in(counter: str, window: str) -> str:
    """Series of ``counter`` that counted anything in the last ``window``.

    ``increase()`` needs two samples of a series in the window, so a series Prometheus first
    reads above 0 (a gateway replica that counted before its first scrape, or scrapes that
    failed from before the count until after it) never rises for it. The second clause
    catches that series: above 0 in the window and absent ``window`` ago (``max_over_time``
    drops the metric name as ``increase`` does, so the two never list one series twice).
    """
    return (
        f"increase({counter}[{window}]) > 0\n"
        f"or max_over_time({counter}[{window}]) > 0 unless {counter} offset {window}"
    )


def engine_series(name: str) -> str:
    """A selector for an engine metric under our prefix or vLLM's (``name`` may be a regex)."""
    return f'{{__name__=~"{ENGINE_PREFIX}:{name}"}}'


@dataclass(frozen=True, slots=True)
class AlertThresholds:
    """When each alert fires. Durations are Prometheus durations (``30s``, ``5m``, ``7d``)."""

    ttft_p99_s: float = 2.0  # the bench SLO's ttft
    itl_p99_s: float = 0.1  # the bench SLO's tpot: time between tokens once streaming
    kv_usage: float = 0.9  # share of the KV cache in use
    waiting: float = 1.0  # requests waiting, averaged over the rate window
    max_num_seqs: int | None = None  # the plan's batch cap: running at it means saturated
    preemptions_per_s: float = 0.05  # ~3 a minute: preemption is a safety net, not a mode
    error_ratio: float = 0.01  # gateway answers 5xx other than 503
    unavailable_ratio: float = 0.01  # gateway answers 503: no replica could take it
    rate_limited_ratio: float = 0.10  # gateway answers 429
    creep_ratio: float = 1.5  # mean prompt now / over the baseline window
    team_budget_warn: float = 0.8  # share of a team's quota or budget: warn, then at 1 spent
    rate_window: str = "5m"
    pending: str = "5m"  # `for:` of latency, KV, queueing and error alerts
    backend_down_for: str = "1m"
    creep_window: str = "1h"
    creep_baseline: str = "7d"
    creep_for: str = "1h"
    at_max_for: str = "30m"  # `inhouse up --replicas MIN:MAX` held at MAX this long

    def with_slo(self, ttft_s: float | None, tpot_s: float | None) -> AlertThresholds:
        """These thresholds with the SLO's objectives where it sets them."""
        return replace(
            self,
            ttft_p99_s=self.ttft_p99_s if ttft_s is None else ttft_s,
            itl_p99_s=self.itl_p99_s if tpot_s is None else tpot_s,
        )


def recording_rules(t: AlertThresholds) -> list[dict[str, str]]:
    """Named series the alerts and the dashboard share."""
    w = t.rate_window

    def p99(metric: str) -> str:
        rate = f"rate({engine_series(metric + '_bucket')}[{w}])"
        return f"histogram_quantile(0.99, sum by (le, {BY_REPLICA}) ({rate}))"

    requests = "inhouse:gateway_requests_total"

    def share(status: str) -> str:
        total = f"sum by (model_name) (rate({requests}[{w}]))"
        # `or … * 0`: a model with traffic and none of these answers reads 0, not "no data"
        return (
            f"(sum by (model_name) (rate({requests}{{{status}}}[{w}])) or {total} * 0)\n/ {total}"
        )

    def prompt_mean(window: str) -> str:
        return (
            f'sum by (model_name) (rate(inhouse:gateway_tokens_total{{kind="prompt"}}[{window}]))\n'
            f'/ sum by (model_name) (rate({requests}{{status="200"}}[{window}]))'
        )

    return [
        {
            "record": "model:time_to_first_token_seconds:p99",
            "expr": p99(names.TTFT),
        },
        {
            "record": "model:inter_token_latency_seconds:p99",
            "expr": p99(ITL),
        },
        {
            "record": "model:kv_cache_usage:ratio",
            "expr": f"max by ({BY_REPLICA}) ({engine_series(KV_USAGE)})",
        },
        {
            "record": "model:num_requests_waiting:avg",
            "expr": f"max by ({BY_REPLICA}) (avg_over_time({engine_series(names.WAITING)}[{w}]))",
        },
        {
            "record": "model:num_preemptions:rate",
            "expr": f"sum by ({BY_REPLICA}) "
            f"(rate({engine_series(names.PREEMPTIONS + '_total')}[{w}]))",
        },
        {"record": "model:gateway_error:ratio", "expr": share('status=~"5..",status!="503"')},
        {"record": "model:gateway_unavailable:ratio", "expr": share('status="503"')},
        {"record": "model:gateway_rate_limited:ratio", "expr": share('status="429"')},
        {"record": "model:prompt_tokens_per_request:mean", "expr": prompt_mean(t.creep_window)},
        {
            "record": "model:prompt_tokens_per_request:baseline",
            "expr": prompt_mean(t.creep_baseline),
        },
    ]


def _alert(name: str, expr: str, pending: str, severity: str, summary: str, runbook: str) -> dict:
    return {
        "alert": name,
        "expr": expr,
        "for": pending,
        "labels": {"severity": severity},
        "annotations": {"summary": summary, "runbook": runbook},
    }


def alerting_rules(t: AlertThresholds) -> list[dict[str, Any]]:
    """One alert per signal, each with what it means and what to do."""
    alerts = [
        _alert(
            "InhouseTTFTAboveSLO",
            f"model:time_to_first_token_seconds:p99 > {t.ttft_p99_s:g}",
            t.pending,
            "warning",
            "p99 time to first token of {{ $labels.model_name }} on {{ $labels.instance }}"
            f" is {{{{ $value | humanizeDuration }}}}, above the SLO of {t.ttft_p99_s:g}s.",
            "Requests queue before their prefill. Check model:num_requests_waiting:avg and "
            "KV usage; add a replica, lower --max-num-seqs if prefill chunks starve, or "
            "shorten prompts (context creep). Re-run `inhouse bench sweep` to find the knee.",
        ),
        _alert(
            "InhouseITLAboveSLO",
            f"model:inter_token_latency_seconds:p99 > {t.itl_p99_s:g}",
            t.pending,
            "warning",
            "p99 time between tokens of {{ $labels.model_name }} on {{ $labels.instance }}"
            f" is {{{{ $value | humanizeDuration }}}}, above the SLO of {t.itl_p99_s:g}s.",
            "The decode batch is too large for the hardware or long prefills interrupt it. "
            "Lower --max-num-seqs or --max-num-batched-tokens, or add a replica.",
        ),
        _alert(
            "InhouseKVCacheNearFull",
            f"model:kv_cache_usage:ratio > {t.kv_usage:g}",
            t.pending,
            "warning",
            "KV cache of {{ $labels.model_name }} on {{ $labels.instance }} is"
            " {{ $value | humanizePercentage }} full.",
            "The plan's average context was too optimistic: sequences wait or are preempted. "
            "Re-plan with the measured average (`inhouse plan --avg-context`), give the cache "
            "more memory, cap --max-model-len, or add a replica.",
        ),
        _alert(
            "InhouseRequestsQueueing",
            f"model:num_requests_waiting:avg > {t.waiting:g}",
            t.pending,
            "warning",
            "{{ $value | humanize }} requests wait on average for {{ $labels.model_name }}"
            " on {{ $labels.instance }}.",
            "Demand exceeds what the replica runs at once. Raise --max-num-seqs if the KV "
            "cache has room (KV usage below ~80%), else add a replica.",
        ),
        _alert(
            "InhousePreemptions",
            f"model:num_preemptions:rate > {t.preemptions_per_s:g}",
            t.pending,
            "warning",
            "{{ $labels.model_name }} on {{ $labels.instance }} preempts"
            " {{ $value | humanize }} sequences a second for want of KV blocks.",
            "Preempted sequences are recomputed: throughput drops when it is needed most. "
            "Lower --max-num-seqs, give the KV cache more memory, or add a replica.",
        ),
        _alert(
            "InhouseGatewayErrors",
            f"model:gateway_error:ratio > {t.error_ratio:g}",
            t.pending,
            "critical",
            "{{ $value | humanizePercentage }} of requests to {{ $labels.model_name }}"
            " end in a server error (5xx other than 503).",
            "Read the gateway's and the backends' logs for the failing requests (the audit "
            "table has error_type per request); check backend health on GET /health.",
        ),
        _alert(
            "InhouseGatewayUnavailable",
            f"model:gateway_unavailable:ratio > {t.unavailable_ratio:g}",
            t.pending,
            "critical",
            "{{ $value | humanizePercentage }} of requests to {{ $labels.model_name }}"
            " get 503: no healthy replica.",
            "Every replica of the model is down or starting. Check InhouseBackendDown, the "
            'backends\' logs and GPU health; a fallback (policy = "fallback") keeps serving.',
        ),
        _alert(
            "InhouseGatewayRateLimited",
            f"model:gateway_rate_limited:ratio > {t.rate_limited_ratio:g}",
            t.pending,
            "warning",
            "{{ $value | humanizePercentage }} of requests to {{ $labels.model_name }}"
            " are refused with 429.",
            "Keys hit their limits or replicas are saturated (queue full). Look at "
            "inhouse:gateway_rejections_total by reason: raise a key's limits, or add capacity.",
        ),
        _alert(
            "InhouseBackendDown",
            'inhouse:gateway_backend_state{state="down"} == 1',
            t.backend_down_for,
            "critical",
            "Backend {{ $labels.backend }} of {{ $labels.model_name }} is marked down.",
            "The gateway's health checks fail on it; traffic goes to the other replicas. "
            "Read the backend's log, restart it; GET /health on the gateway shows last_error.",
        ),
        _alert(
            "InhouseFallbackTaken",
            counted_in("inhouse:gateway_fallbacks_total", t.rate_window),
            "0s",
            "info",
            "Requests for {{ $labels.model_name }} went to the fallback.",
            "Local replicas were saturated or down and the request left the building. Check "
            "capacity and backend health; set allow_fallback = false where data must stay.",
        ),
        _alert(
            "InhouseContextCreep",
            "model:prompt_tokens_per_request:mean\n"
            f"> {t.creep_ratio:g} * model:prompt_tokens_per_request:baseline",
            t.creep_for,
            "info",
            "Mean prompt of {{ $labels.model_name }} over the last "
            f"{t.creep_window} is {{{{ $value | humanize }}}} tokens, over {t.creep_ratio:g}x "
            f"its {t.creep_baseline} baseline.",
            "Prompts are growing (longer histories, bigger RAG contexts): the plan's average "
            "context no longer holds. Re-plan with the new average before KV usage and TTFT "
            "follow; trim histories or retrieved context in the client.",
        ),
        _alert(
            "InhouseReleaseRolledBack",
            counted_in("inhouse:gateway_release_rollbacks_total", t.rate_window),
            "0s",
            "warning",
            "The guardrail rolled back the candidate release of {{ $labels.model_name }}"
            " ({{ $labels.reason }}).",
            "The candidate crossed a threshold and every request is back on the stable "
            "release. `inhouse release status MODEL` shows the figures and the event; "
            "`inhouse release compare MODEL` the shadow pairs. Fix the candidate, then start "
            "a new canary.",
        ),
        _alert(
            "InhouseTeamBudgetNearlySpent",
            f"{TEAM_BUDGET} >= {t.team_budget_warn:g} < 1",
            "0s",
            "warning",
            "Team {{ $labels.team }} has used {{ $value | humanizePercentage }} of its"
            " {{ $labels.budget }} budget for this period.",
            "Tell the team; raise its budget (`inhouse teams update`) if the use is expected, "
            "or find the key that spends it (`inhouse usage --by person`, the console).",
        ),
        _alert(
            "InhouseTeamBudgetSpent",
            f"{TEAM_BUDGET} >= 1",
            "0s",
            "critical",
            "Team {{ $labels.team }} has spent its {{ $labels.budget }} budget for this period.",
            "A hard-stop team's keys now get 429 insufficient_quota until the period resets; "
            "a warn-only team keeps being served. Raise the budget or wait for the reset.",
        ),
        _alert(
            "InhouseReplicasAtMax",
            f"max by (model_name) ({gateway_names.REPLICAS})\n"
            f">= max by (model_name) ({gateway_names.REPLICAS_MAX})",
            t.at_max_for,
            "warning",
            "{{ $labels.model_name }} has run its most replicas ({{ $value }}) for "
            f"{t.at_max_for}: the autoscaler can add no more.",
            "The load needs more than MAX replicas, or a replica is too small for it. Check "
            "model:time_to_first_token_seconds:p99 and queueing against the SLO; raise MAX "
            "where the hardware has room (`inhouse up --replicas MIN:MAX`), add a host, or "
            "re-plan (`inhouse plan`) for more sequences per replica.",
        ),
    ]
    if t.max_num_seqs is not None:
        alerts.append(
            _alert(
                "InhouseBatchFull",
                f"max by ({BY_REPLICA}) ({engine_series(names.RUNNING)}) >= {t.max_num_seqs}",
                t.pending,
                "warning",
                "{{ $labels.model_name }} on {{ $labels.instance }} runs"
                f" {{{{ $value }}}} sequences, the plan's max_num_seqs ({t.max_num_seqs}).",
                "The replica is at the concurrency the plan sized it for. Add a replica, or "
                "re-plan if KV usage shows room for more.",
            )
        )
    return alerts


def rule_groups(t: AlertThresholds) -> dict[str, Any]:
    """The whole rule file as a dict, ready for YAML."""
    return {
        "groups": [
            {"name": "inhouse-recording", "rules": recording_rules(t)},
            {"name": "inhouse-alerts", "rules": alerting_rules(t)},
        ]
    }


class _Literal(str):
    """A string YAML writes as a block (``|``) when it spans lines."""


def _literal(dumper: yaml.SafeDumper, value: _Literal) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", str(value), style=style)


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Literal, _literal)


def rules_yaml(t: AlertThresholds) -> str:
    """The rule file Prometheus loads (``rule_files:``), with a header naming its source."""

    def blocks(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: blocks(v) for k, v in node.items()}
        if isinstance(node, list):
            return [blocks(v) for v in node]
        return _Literal(node) if isinstance(node, str) and "\n" in node else node

    body = yaml.dump(
        blocks(rule_groups(t)), Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True
    )
    return "# Generated by `inhouse observe rules`; edit the thresholds there, not here.\n" + body
