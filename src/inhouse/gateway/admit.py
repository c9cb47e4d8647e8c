"""Step 3 of a request: its token budget, then the key's limits and quota; a Call when all
admit it, else a Refusal (429) with the headers and wait to send."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from inhouse.api.errors import APIError
from inhouse.cost.settings import TokenPrices
from inhouse.gateway.call import Call
from inhouse.gateway.endpoints import ENDPOINTS
from inhouse.gateway.keys import ApiKey, KeyStore
from inhouse.gateway.limits import Admission, KeyLimiter, LimitCalls, limit_error, quota_exceeded
from inhouse.gateway.parse import Parsed
from inhouse.gateway.routing import Router
from inhouse.gateway.tokens import budget
from inhouse.gateway.upstream import UpstreamClients
from inhouse.gateway.usage.teams import TeamStore, team_exhausted


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request answered with an error before it reached any upstream."""

    error: APIError
    headers: dict[str, str] | None = None
    retry_after_s: float | None = None


@dataclass(slots=True)
class Admitter:
    """Holds a request's tokens against its key's limits and quota, or refuses it."""

    keys: KeyStore
    limiter: KeyLimiter
    limits: LimitCalls
    router: Router
    upstreams: UpstreamClients
    teams: TeamStore
    prices: TokenPrices

    async def admit(
        self, key: ApiKey, request: Parsed, ts: float, started: float, prompt_text: str | None
    ) -> Call | Refusal:
        """Reserve what the request may use; the admitted Call, or why not."""
        route, needs, endpoint, body = request.route, request.needs, request.endpoint, request.body
        prompt, cap = await budget(self.upstreams, self.router, key, route, endpoint, body, needs)
        reserve = needs.reserve(prompt, cap)
        metered = ENDPOINTS[endpoint].metered
        admission = await self.limits(self.limiter.admit, key, reserve, metered)
        if admission.allowed and metered and key.quota_tokens is not None:
            admission = await self._reserve_quota(key, reserve, ts, admission.headers)
        hold = None
        if admission.allowed and metered and key.team is not None:
            hold = (reserve, self.prices.of(prompt, cap))
            admission, held = await self._reserve_team(key, hold, ts, admission.headers)
            hold = hold if held else None
        if not admission.allowed:
            error = limit_error(admission.reason or "requests", admission.message)
            return Refusal(error, admission.headers, admission.retry_after_s)
        return Call(
            key, route, endpoint, needs, prompt, cap, reserve, bool(body.get("stream")), ts,
            started, dict(admission.headers), prompt_text, metered=metered, team_hold=hold,
            priority=request.priority,
        )  # fmt: skip

    async def _reserve_team(
        self, key: ApiKey, hold: tuple[int, float], ts: float, headers: dict[str, str]
    ) -> tuple[Admission, bool]:
        """Hold the request's tokens and money in its team (and whether anything is held),
        or undo the key's admission."""
        assert key.team is not None
        held, refused = await asyncio.to_thread(self.teams.reserve, key.team, *hold, ts)
        if refused is None:
            return Admission(True, headers=headers), held
        if key.quota_tokens is not None:
            await asyncio.to_thread(self.keys.settle_quota, key, ts, hold[0], 0)
        await self.limits(self.limiter.withdraw, key, hold[0])
        return team_exhausted(refused, hold, ts, headers), False

    async def _reserve_quota(
        self, key: ApiKey, reserve: int, ts: float, headers: dict[str, str]
    ) -> Admission:
        """Hold `reserve` tokens of the key's quota, or withdraw the admission just made."""
        used = await asyncio.to_thread(self.keys.reserve_quota, key, reserve, ts)
        if used is None:
            return Admission(True, headers=headers)
        await self.limits(self.limiter.withdraw, key, reserve)
        return quota_exceeded(key, used, reserve, ts, headers)
