"""Degrade under overload: an interactive request for a model with `policy = "degrade"` is
answered by the smaller `degrade_to` model when the wait expected for the model it asked for
exceeds `degrade_after_s`.

The expected wait, from what the gateway knows: 0 while some capable replica that is up has
a free slot (`max_in_flight`) and reports no requests waiting in its engine (the
`num_requests_waiting` gauge of its `/metrics`); else the requests ahead of this one (the
gateway's queue for this class and sooner ones, plus those waiting in the engines), plus
itself, spread over the up replicas' slots, times the time a call recently held its slot
(`Router.recent_service_s`); unbounded when no replica is up.

Never degraded: a key created with `--no-degrade`, a model whose policy is not "degrade",
a class other than interactive, an endpoint other than chat or completions (another
model's embeddings live in another space), a request for a LoRA adapter (which runs on its
own base), a key that may not use the smaller model, or a
request the smaller model cannot serve (a capability it lacks, an explicit output cap
above its `max_output`, a prompt its context cannot hold). Those wait in the queue, or get
429, as without the policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inhouse.gateway.backends import BackendState
from inhouse.gateway.call import Call
from inhouse.gateway.config import GatewayConfig, ModelRoute
from inhouse.gateway.endpoints import ENDPOINTS
from inhouse.gateway.metrics import GatewayMetrics
from inhouse.gateway.needs import Needs, missing_capability
from inhouse.gateway.priority import rank
from inhouse.gateway.routing import Router

DEGRADED_HEADER = "x-inhouse-degraded-from"


def expected_wait_s(router: Router, route: ModelRoute, needs: Needs, priority: str) -> float:
    """Seconds a request of class `priority` can expect to wait for a replica of `route`
    (see the module's docstring)."""
    capable = [
        b for b in router.backends[route.name] if missing_capability(b.upstream, needs) is None
    ]
    up = [b for b in capable if b.state is BackendState.UP]
    if not up:
        return math.inf
    if any(b.routable and b.waiting == 0 for b in up):
        return 0.0
    ahead = router.queue_depth(route.name, rank(priority)) + sum(b.waiting for b in up)
    slots = sum(b.upstream.max_in_flight for b in up)
    return (ahead + 1) / max(1, slots) * router.recent_service_s(route.name)


@dataclass(slots=True)
class Degrader:
    """Sends an admitted call to its model's smaller one when the policy says so."""

    config: GatewayConfig
    router: Router
    metrics: GatewayMetrics

    def apply(self, call: Call) -> None:
        """Move `call` to the smaller model (noting where from, in its headers too) when
        it may and should be degraded; else leave it."""
        target = self._target(call)
        if target is None:
            return
        cap = _cap_on(target, call.needs, call.output_cap)
        if cap is None:
            return
        if expected_wait_s(self.router, call.route, call.needs, call.priority) <= (
            call.route.degrade_after_s
        ):
            return
        self.metrics.degraded.labels(call.route.name).inc()
        call.degraded_from, call.route, call.output_cap = call.route.name, target, cap
        call.headers[DEGRADED_HEADER] = call.degraded_from

    def _target(self, call: Call) -> ModelRoute | None:
        """The smaller model this call may be sent to, if its policy, class and key allow."""
        route = call.route
        if (
            route.policy != "degrade"
            or route.degrade_to is None
            or call.priority != "interactive"
            or call.adapter is not None  # the smaller model does not serve it
            or not call.key.allow_degrade
            or not ENDPOINTS[call.endpoint].generates
            or not call.key.may_use(route.degrade_to)
        ):
            return None
        target = self.config.model(route.degrade_to)
        if target is None or self.router.capability_gap(target, call.needs, False) is not None:
            return None
        return target


def _cap_on(target: ModelRoute, needs: Needs, cap: int) -> int | None:
    """The output cap to send the smaller model, or None when it cannot serve the request:
    the client's cap above its `max_output`, or the longest prompt filling its context."""
    limit, context = target.limit("max_output"), target.limit("max_context")
    if needs.max_output is not None:
        if limit is not None and needs.max_output > limit:
            return None
    else:
        cap = needs.output_cap(target.default_max_tokens, limit)
    longest = needs.longest()[0]
    if context is not None:
        if longest >= context:
            return None
        cap = cap if needs.max_output is not None else max(1, min(cap, context - longest))
        if longest + cap > context:
            return None
    return cap
