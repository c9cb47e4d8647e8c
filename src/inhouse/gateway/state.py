"""The objects that hold the gateway's state, built once (`app.build_gateway`) and handed
whole to each step of the request path (admission, the upstream call, settlement)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine

from inhouse.cost.settings import TokenPrices
from inhouse.gateway.audit.writer import AuditWriter
from inhouse.gateway.config import GatewayConfig
from inhouse.gateway.exchange import UpstreamClients
from inhouse.gateway.holds import HoldStore
from inhouse.gateway.keys import KeyStore
from inhouse.gateway.limits import KeyLimiter, LimitCalls
from inhouse.gateway.metrics import GatewayMetrics
from inhouse.gateway.routing import Router
from inhouse.gateway.usage.teams import TeamStore


@dataclass(frozen=True, slots=True)
class GatewayState:
    """Config, database, keys, limits, routes, upstream clients, teams, holds, audit and
    metrics.

    `limits` runs the limiter's calls inline, or in a thread when they query the database
    (`shared_limits`)."""

    config: GatewayConfig
    db: Engine
    keys: KeyStore
    limiter: KeyLimiter
    limits: LimitCalls
    router: Router
    upstreams: UpstreamClients
    teams: TeamStore
    holds: HoldStore
    audit: AuditWriter
    metrics: GatewayMetrics

    @property
    def prices(self) -> TokenPrices:
        """What a token is charged (`[cost]`): for team budgets."""
        return self.config.cost.charged
