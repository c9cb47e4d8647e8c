"""Step 3 of a request: what it reserves (exact prompt tokens from a backend's `/tokenize`,
and its output cap), then the key's limits, quota and team; a Call when all admit it, else
a Refusal (429) with the headers and wait to send.

inhouse and vLLM backends render chat messages through their chat template in `/tokenize`
and answer the count and their `max_model_len`; the gateway asks the least-loaded replica
that is up.
Where no replica can count (other kinds, a replica down, an error, a timeout), the request's
upper-bound estimate stands (see `parsing`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any

from inhouse.api.errors import APIError
from inhouse.gateway.backends import Backend, BackendState
from inhouse.gateway.call import Call
from inhouse.gateway.config import ModelRoute, Upstream
from inhouse.gateway.endpoints import ENDPOINTS
from inhouse.gateway.exchange import UpstreamClients
from inhouse.gateway.keys import ApiKey
from inhouse.gateway.limits import Admission, limit_error, quota_exceeded
from inhouse.gateway.needs import Needs
from inhouse.gateway.parsing import Parsed, tools_bound
from inhouse.gateway.routing import Router
from inhouse.gateway.state import GatewayState
from inhouse.gateway.usage.teams import team_exhausted

TOKENIZE_TIMEOUT_S = 5.0
RECOUNT_TIMEOUT_S = 1.0  # a cut-off answer's count waits less: its settlement waits for it


@dataclass(frozen=True, slots=True)
class PromptCount:
    """Prompt tokens to reserve, those of its longest single prompt (a batch's), and the
    backend's context length when it said."""

    tokens: int
    longest: int
    max_model_len: int | None = None


async def budget(
    upstreams: UpstreamClients, router: Router, key: ApiKey, route: ModelRoute, endpoint: str,
    body: dict[str, Any], needs: Needs,
) -> tuple[int, int]:  # fmt: skip
    """Prompt tokens to reserve and the output cap to send upstream.

    Only a key with a tokens/minute limit, a quota or a team needs the prompt counted:
    exactly by a replica's `/tokenize`, else its upper bound (never the estimate, which
    can fall short and let a quota or budget be overrun). Without a cap in the request, the
    model's `default_max_tokens` (within `max_output`) is sent, shrunk to fit the context.
    """
    cap = needs.output_cap(route.default_max_tokens, route.limit("max_output"))
    prompt, context = needs.prompt_tokens, route.limit("max_context")
    longest = needs.longest()[0]
    if key.tpm is not None or key.quota_tokens is not None or key.team is not None:
        counted = await count_prompt(upstreams, router, route.name, endpoint, body, needs)
        prompt, longest = counted.tokens, counted.longest
        context = counted.max_model_len or context
    if needs.max_output is None and context is not None and ENDPOINTS[endpoint].generates:
        cap = max(1, min(cap, context - longest))  # each prompt of a batch has its own context
    return prompt, cap


async def count_prompt(
    upstreams: UpstreamClients, router: Router, model: str, endpoint: str, body: dict[str, Any],
    needs: Needs, busy: Backend | None = None,
) -> PromptCount:  # fmt: skip
    """The prompt's exact token count from a replica's `/tokenize`, else its upper bound.
    The least-loaded replica that is up counts it, one other than `busy` where there is one."""
    counters = [
        b for b in router.backends[model] if b.state is BackendState.UP and b.upstream.tokenizes
    ]
    counter = min(counters, key=lambda b: (b is busy, b.load()), default=None)
    request = _tokenize_body(endpoint, body)
    bound = PromptCount(needs.prompt_bound, needs.longest()[1])
    if counter is None or request is None:
        return bound
    upstream = counter.upstream
    with contextlib.suppress(OSError, TimeoutError, ValueError):
        async with asyncio.timeout(TOKENIZE_TIMEOUT_S):
            answer = await _tokenize(upstreams, upstream, request)
        count, limit = answer.get("count"), answer.get("max_model_len")
        if isinstance(count, int) and count >= 0:
            extra = tools_bound(body) if ENDPOINTS[endpoint].prompt == "messages" else 0
            limit = limit if isinstance(limit, int) else None
            return PromptCount(count + extra, count + extra, limit)  # one prompt: no batch
    return bound


async def count_cut_prompt(state: GatewayState, call: Call, body: dict[str, Any]) -> int:
    """The prompt tokens of an answer cut off before the upstream reported its usage (a
    client that left a stream): counted by a replica's `/tokenize`, else the prompt's upper
    bound, never the reservation's estimate, which can count fewer. Another replica than
    the one that ran it counts it where one is up: that one is aborting the request now
    (on a CPU its API server's time is what the abort waits for)."""
    ran = None if call.lease is None else call.lease.backend
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(RECOUNT_TIMEOUT_S):
            counted = await count_prompt(
                state.upstreams, state.router, call.route.name, call.endpoint, body, call.needs,
                ran,
            )  # fmt: skip
            return counted.tokens
    return call.needs.prompt_bound


def _tokenize_body(endpoint: str, body: dict[str, Any]) -> dict[str, Any] | None:
    """What `/tokenize` counts of a chat's messages or a completion's one text prompt."""
    prompt = ENDPOINTS[endpoint].prompt
    if prompt == "messages":
        return {"messages": body["messages"], "add_generation_prompt": True}
    if prompt == "prompt" and isinstance(body.get("prompt"), str):
        return {"prompt": body["prompt"]}
    return None


async def _tokenize(
    upstreams: UpstreamClients, upstream: Upstream, request: dict[str, Any]
) -> dict[str, Any]:
    payload = json.dumps({"model": upstream.model, **request}).encode()
    async with upstreams.client(upstream).post("/tokenize", payload) as reply:
        answer = json.loads(await reply.read())
    if reply.status != 200 or not isinstance(answer, dict):
        raise ValueError(f"/tokenize answered {reply.status}")
    return answer


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request answered with an error before it reached any upstream."""

    error: APIError
    headers: dict[str, str] | None = None
    retry_after_s: float | None = None


@dataclass(slots=True)
class Admitter:
    """Holds a request's tokens against its key's limits and quota, or refuses it."""

    state: GatewayState

    async def admit(
        self, key: ApiKey, request: Parsed, ts: float, started: float, prompt_text: str | None
    ) -> Call | Refusal:
        """Reserve what the request may use; the admitted Call, or why not."""
        route, needs, endpoint, body = request.route, request.needs, request.endpoint, request.body
        prompt, cap = await budget(
            self.state.upstreams, self.state.router, key, route, endpoint, body, needs
        )
        reserve = needs.reserve(prompt, cap)
        metered = ENDPOINTS[endpoint].metered
        admission = await self.state.limits(self.state.limiter.admit, key, reserve, metered)
        hold = None
        if admission.allowed and metered and (key.quota_tokens is not None or key.team is not None):
            admission, hold = await self._hold(key, (prompt, reserve), ts, admission.headers)
        if not admission.allowed:
            error = limit_error(admission.reason or "requests", admission.message)
            return Refusal(error, admission.headers, admission.retry_after_s)
        return Call(
            key, route, endpoint, needs, prompt, cap, reserve, bool(body.get("stream")), ts,
            started, dict(admission.headers), prompt_text, metered=metered, hold=hold,
            priority=request.priority, adapter=request.adapter,
        )  # fmt: skip

    async def _hold(
        self, key: ApiKey, tokens: tuple[int, int], ts: float, headers: dict[str, str]
    ) -> tuple[Admission, str | None]:
        """Hold the request's `(prompt, reserve)` tokens, and the money they may cost, in
        its key's quota and its team's quota and budget together (`holds`); or undo the
        key's rate admission and say which refused."""
        prompt, reserve = tokens
        money = self.state.prices.of(prompt, reserve - prompt)
        held = await asyncio.to_thread(self.state.holds.reserve, key, reserve, money, ts)
        if not held.refused:
            return Admission(True, headers=headers), held.hold
        await self.state.limits(self.state.limiter.withdraw, key, reserve)
        if held.key_used is not None:
            return quota_exceeded(key, held.key_used, reserve, ts, headers), None
        assert held.team is not None
        return team_exhausted(held.team, (reserve, money), ts, headers), None
