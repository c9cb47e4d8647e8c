"""Settlement, the one way an admitted request ends: charge the tokens it really used,
free its replica slot and its key's slot, and hand it to the ledger."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from inhouse.cost.settings import TokenPrices
from inhouse.gateway.call import Call, Outcome
from inhouse.gateway.keys import KeyStore
from inhouse.gateway.ledger import Ledger
from inhouse.gateway.limits import KeyLimiter, LimitCalls
from inhouse.gateway.routing import Router
from inhouse.gateway.usage.teams import TeamStore

DRAIN_SETTLE_S = 2.0


def charge(call: Call, outcome: Outcome) -> tuple[int, int]:
    """Prompt and completion tokens to charge: the upstream's usage, else the reserved
    prompt (if it reached an upstream) and one token per content chunk."""
    if not call.metered:
        return 0, 0
    reached = call.lease is not None and outcome.status != 0
    prompt = outcome.prompt_tokens
    if prompt is None:
        prompt = call.prompt if reached else 0
    completion = outcome.completion_tokens
    if completion is None:
        completion = outcome.content_chunks
    return prompt, completion


@dataclass(slots=True)
class Settler:
    """Settles each admitted call exactly once and counts those still open."""

    keys: KeyStore
    limiter: KeyLimiter
    limits: LimitCalls
    router: Router
    ledger: Ledger
    teams: TeamStore
    prices: TokenPrices
    active: int = field(default=0, init=False)  # admitted calls not yet settled
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, init=False, repr=False)

    def opened(self) -> None:
        """Count a call just admitted."""
        self.active += 1

    def settle(self, call: Call, outcome: Outcome) -> None:
        """End `call`: the ledger's row at once; limits and quota inline when they live in
        memory, else in a task that `drain` waits for. A second call does nothing."""
        if call.settled:
            return
        call.settled = True
        self.active -= 1
        if call.lease is not None:
            self.router.release(call.lease)
        prompt, completion = charge(call, outcome)
        self.ledger.settled(call, outcome, prompt, completion)
        charged = prompt + completion
        if call.team_hold is not None:
            self._spawn(self._settle_team(call, (charged, self.prices.of(prompt, completion))))
        if self.limits.blocking or call.key.quota_tokens is not None:
            self._spawn(self._settle_limits(call, charged))
            return
        self.limiter.settle(call.key, call.reserve, charged)
        self.limiter.release(call.key)

    async def _settle_limits(self, call: Call, charged: int) -> None:
        await self.limits(self.limiter.settle, call.key, call.reserve, charged)
        if call.key.quota_tokens is not None:
            await asyncio.to_thread(
                self.keys.settle_quota, call.key, call.ts, call.reserve, charged
            )
        self.limiter.release(call.key)

    async def _settle_team(self, call: Call, charged: tuple[int, float]) -> None:
        assert call.key.team is not None and call.team_hold is not None
        await asyncio.to_thread(self.teams.settle, call.key.team, call.ts, call.team_hold, charged)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout_s: float = DRAIN_SETTLE_S) -> None:
        """On shutdown: let cancelled calls settle (bounded), then wait for settlements."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self.active:
                    await asyncio.sleep(0.01)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
