"""Running one engine request for a route: metrics, abort on disconnect, collecting results."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TypeVar

from starlette.requests import Request

from inhouse.api.errors import server_error, service_unavailable
from inhouse.engine.async_engine import EngineDeadError
from inhouse.engine.errors import EngineInputError, RequestFailedError
from inhouse.engine.outputs import RequestOutput, TokenLogprob
from inhouse.engine.request import EngineRequest
from inhouse.server.context import ServerContext
from inhouse.server.errors import ClientDisconnected
from inhouse.server.metrics import TokenClock
from inhouse.server.request_params import engine_input_error

T = TypeVar("T")
DISCONNECT_POLL_S = 0.5


def request_id(prefix: str) -> str:
    """A fresh response id such as ``chatcmpl-…``."""
    return f"{prefix}-{uuid.uuid4().hex}"


async def generate(ctx: ServerContext, request: EngineRequest) -> AsyncIterator[RequestOutput]:
    """The engine's deltas for one request, with latency metrics recorded.

    Bad input raises a 400 :class:`APIError` before anything is yielded; a request
    that fails inside the engine, a 500 (the others go on); a dead engine a 503 (and
    the server reports unhealthy from then on). If the consumer stops early (a client
    disconnect), the request is aborted.
    """
    engine = ctx.require_engine()
    clock = TokenClock(ctx.metrics.itl, time.monotonic)
    finished = False
    try:
        async with aclosing(engine.generate(request)) as outputs:
            async for output in outputs:
                clock.tick(output)
                if output.finished:
                    finished = True
                    if output.timing is not None:
                        ctx.metrics.observe_finished(output.timing)
                yield output
    except EngineInputError as exc:
        raise engine_input_error(exc) from exc
    except RequestFailedError as exc:
        finished = True
        raise server_error(f"The request failed in the engine: {exc}") from exc
    except EngineDeadError as exc:
        ctx.mark_engine_dead(str(exc))
        raise service_unavailable(f"The engine has stopped: {exc}") from exc
    finally:
        if not finished:
            engine.abort(request.request_id)


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it (which aborts its engine request) if the client leaves."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                raise ClientDisconnected
    finally:
        task.cancel()


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


async def collect(ctx: ServerContext, request: EngineRequest) -> RequestResult:
    """Run a request to the end and gather its choices."""
    result = RequestResult([ChoiceResult() for _ in range(request.params.n)])
    async for output in generate(ctx, request):
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
