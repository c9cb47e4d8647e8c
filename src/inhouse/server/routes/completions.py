"""``POST /v1/completions``: the legacy text-completion endpoint, whole and streamed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import anyio
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from inhouse.api.common import Usage
from inhouse.api.completions import Completion, CompletionChoice, CompletionRequest
from inhouse.engine.errors import EngineInputError
from inhouse.engine.fast_encode import encode
from inhouse.engine.info import EngineInfo
from inhouse.engine.outputs import RequestOutput
from inhouse.engine.request import EngineRequest
from inhouse.engine.sampling_params import SamplingParams
from inhouse.server.context import ServerContext
from inhouse.server.generation import (
    RequestResult,
    collect,
    generate,
    request_id,
    unless_disconnected,
)
from inhouse.server.logprobs import completion_logprobs
from inhouse.server.request_params import engine_input_error, sampling_params
from inhouse.server.routes.deps import context, require_api_key
from inhouse.server.sse import sse_response

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/completions", response_model=None)
async def create_completion(
    body: CompletionRequest, request: Request, ctx: ServerContext = Depends(context)
) -> JSONResponse | StreamingResponse:
    """OpenAI's legacy completions; a batch of prompts gives ``len(prompts) * n`` choices."""
    adapter = ctx.check_model(body.model)
    info = ctx.require_engine().info
    tokenizer = info.tokenizer
    prompts = await ctx.prompt_workers.run(_token_ids, info, body.prompts())
    params = sampling_params(body, max_tokens=body.completion_limit, logprobs=body.logprobs)
    rid = request_id("cmpl")
    requests = [
        EngineRequest(
            f"{rid}-{k}", p, params, body.cache_salt, priority=body.priority, adapter=adapter
        )
        for k, p in enumerate(prompts)
    ]
    echoes = [""] * len(prompts)
    if body.echo:
        echoes = await ctx.prompt_workers.run(tokenizer.batch_decode, prompts)
    if body.stream:
        streams = [generate(ctx, r) for r in requests]
        try:  # bad input fails here, as a 400 before any byte is sent
            firsts = [await anext(s) for s in streams]
        except BaseException:
            for stream in streams:
                await stream.aclose()
            raise
        chunks = _chunks(ctx.answer_name(adapter), body, params, rid, echoes, firsts, streams)
        return sse_response(chunks)
    results = await unless_disconnected(request, _collect_all(ctx, requests))
    choices = []
    for k, result in enumerate(results):
        for i, choice in enumerate(result.choices):
            logprobs = None
            if body.logprobs is not None:
                logprobs = completion_logprobs(choice.logprobs, len(echoes[k]))
            choices.append(
                CompletionChoice(
                    index=k * params.n + i,
                    text=echoes[k] + choice.text,
                    logprobs=logprobs,
                    finish_reason=choice.finish_reason,
                )
            )
    prompt_tokens = sum(r.num_prompt_tokens for r in results)
    generated = sum(r.num_generated_tokens for r in results)
    cached = sum(r.num_cached_tokens for r in results)
    response = Completion(
        id=rid,
        created=int(time.time()),
        model=ctx.answer_name(adapter),
        choices=choices,
        usage=Usage.of(prompt_tokens, generated, cached),
    )
    return JSONResponse(response.model_dump(exclude_none=True))


def _token_ids(info: EngineInfo, prompts: list[str | list[int]]) -> list[list[int]]:
    """Each prompt's token ids: a text tokenized (with the model's special tokens), ids as
    given; a 400 for a text too long by its length alone, before any is tokenized."""
    texts = [p for p in prompts if isinstance(p, str)]
    try:
        for text in texts:
            info.refuse_surely_too_long(text)
    except EngineInputError as exc:
        raise engine_input_error(exc) from exc
    return [
        p if isinstance(p, list) else encode(info.tokenizer, p, add_special_tokens=True)
        for p in prompts
    ]


async def _collect_all(ctx: ServerContext, requests: list[EngineRequest]) -> list[RequestResult]:
    """Run the prompts together; if one fails (or we are cancelled) the others are aborted."""
    tasks = [asyncio.ensure_future(collect(ctx, r)) for r in requests]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()


async def _merged(
    firsts: list[RequestOutput], streams: list[AsyncIterator[RequestOutput]]
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Outputs of several requests as they come, tagged with the request's position."""
    queue: asyncio.Queue[tuple[int, RequestOutput | Exception | None]] = asyncio.Queue()

    async def pump(k: int, first: RequestOutput, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            await queue.put((k, first))
            if not first.finished:
                async for output in stream:
                    await queue.put((k, output))
        except Exception as exc:  # the request failed: the batch fails with it, at once
            await queue.put((k, exc))
            return
        await queue.put((k, None))

    tasks = [
        asyncio.create_task(pump(k, f, s))
        for k, (f, s) in enumerate(zip(firsts, streams, strict=True))
    ]
    try:
        running = len(tasks)
        while running:
            k, output = await queue.get()
            if isinstance(output, Exception):
                raise output
            if output is None:
                running -= 1
                continue
            yield k, output
    finally:
        for task in tasks:
            task.cancel()
        # A stream still iterated by its pump cannot be closed ("aclose(): asynchronous
        # generator is already running"): wait for the pumps first, shielded from the
        # client's disconnect that may have brought us here, then close what none ran.
        with anyio.CancelScope(shield=True):
            await asyncio.gather(*tasks, return_exceptions=True)
            for stream in streams:
                await stream.aclose()


async def _chunks(
    model: str,
    body: CompletionRequest,
    params: SamplingParams,
    rid: str,
    echoes: list[str],
    firsts: list[RequestOutput],
    streams: list[AsyncIterator[RequestOutput]],
) -> AsyncIterator[Completion]:
    created = int(time.time())
    offsets = {(k, i): len(echoes[k]) for k in range(len(echoes)) for i in range(params.n)}
    echoed: set[tuple[int, int]] = set()
    prompt_tokens = {k: f.num_prompt_tokens for k, f in enumerate(firsts)}
    cached = {k: f.num_cached_tokens for k, f in enumerate(firsts)}
    generated = 0
    async for k, output in _merged(firsts, streams):
        for delta in output.outputs:
            generated += len(delta.token_ids)
            key = (k, delta.index)
            echo = "" if key in echoed else echoes[k]
            echoed.add(key)
            logprobs = None
            if body.logprobs is not None and delta.logprobs:
                logprobs = completion_logprobs(delta.logprobs, offsets[key])
            offsets[key] += len(delta.text)
            choice = CompletionChoice(
                index=k * params.n + delta.index,
                text=echo + delta.text,
                logprobs=logprobs,
                finish_reason=delta.finish_reason,
            )
            yield Completion(id=rid, created=created, model=model, choices=[choice])
    options = body.stream_options
    if options is not None and options.include_usage:
        usage = Usage.of(sum(prompt_tokens.values()), generated, sum(cached.values()))
        yield Completion(id=rid, created=created, model=model, choices=[], usage=usage)
