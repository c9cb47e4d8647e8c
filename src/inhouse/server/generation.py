"""Running one engine request for a route: metrics, abort on disconnect, collecting results."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from inhouse.engine.errors import EngineInputError
from inhouse.engine.outputs import RequestOutput, TokenLogprob
from inhouse.engine.sampling import SamplingParams
from inhouse.server.context import ServerContext
from inhouse.server.metrics import TokenClock
from inhouse.server.sampling import engine_input_error


def request_id(prefix: str) -> str:
    """A fresh response id such as ``chatcmpl-…``."""
    return f"{prefix}-{uuid.uuid4().hex}"


async def generate(
    ctx: ServerContext,
    rid: str,
    prompt_ids: list[int],
    params: SamplingParams,
    cache_salt: str | None,
) -> AsyncIterator[RequestOutput]:
    """The engine's deltas for one request, with latency metrics recorded.

    Bad input raises a 400 :class:`APIError` before anything is yielded. If the
    consumer stops early (a client disconnect), the request is aborted.
    """
    engine = ctx.require_engine()
    clock = TokenClock(ctx.metrics.itl, time.monotonic)
    stream = engine.generate(rid, prompt_ids, params, cache_salt=cache_salt)
    finished = False
    try:
        try:
            first = await anext(stream)
        except EngineInputError as exc:
            raise engine_input_error(exc) from exc
        outputs = _chain(first, stream)
        async for output in outputs:
            clock.tick(output)
            if output.finished:
                finished = True
                if output.timing is not None:
                    ctx.metrics.observe_finished(output.timing)
            yield output
    finally:
        if not finished:
            engine.abort(rid)
        await stream.aclose()


async def _chain(first: RequestOutput, rest: AsyncIterator[RequestOutput]):
    yield first
    async for item in rest:
        yield item


@dataclass(slots=True)
class ChoiceResult:
    """Everything one choice generated."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass(slots=True)
class RequestResult:
    """A finished request: its choices and token counts."""

    choices: list[ChoiceResult]
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0

    @property
    def num_generated_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.choices)


async def collect(
    ctx: ServerContext,
    rid: str,
    prompt_ids: list[int],
    params: SamplingParams,
    cache_salt: str | None,
) -> RequestResult:
    """Run a request to the end and gather its choices."""
    result = RequestResult([ChoiceResult() for _ in range(params.n)])
    async for output in generate(ctx, rid, prompt_ids, params, cache_salt):
        result.num_prompt_tokens = output.num_prompt_tokens
        result.num_cached_tokens = output.num_cached_tokens
        for delta in output.outputs:
            choice = result.choices[delta.index]
            choice.text += delta.text
            choice.token_ids += delta.token_ids
            choice.logprobs += delta.logprobs or []
            if delta.finish_reason is not None:
                choice.finish_reason = delta.finish_reason
                choice.stop_reason = delta.stop_reason
    return result
