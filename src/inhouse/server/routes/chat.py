"""``POST /v1/chat/completions``: whole and streamed, with response formats and tools."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse

from inhouse.api.chat import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
)
from inhouse.api.common import Usage
from inhouse.api.errors import invalid_request
from inhouse.engine.outputs import RequestOutput
from inhouse.engine.request import EngineRequest
from inhouse.engine.structured import CompiledGuide, GrammarCompiler, GrammarError
from inhouse.server.choices import ChoiceTranslator, merge_deltas, translator_for
from inhouse.server.context import ServerContext
from inhouse.server.generation import collect, generate, request_id, unless_disconnected
from inhouse.server.logprobs import chat_logprobs
from inhouse.server.request_params import sampling_params
from inhouse.server.routes.deps import context, require_api_key
from inhouse.server.sse import sse_response
from inhouse.server.tools import forced_tool_schema

router = APIRouter(dependencies=[Depends(require_api_key)])


@dataclass(slots=True)
class PreparedChat:
    """A chat request turned into engine input and a way to read the output back."""

    request: EngineRequest
    new_translator: Callable[[], ChoiceTranslator]
    top_logprobs: int | None


@router.post("/v1/chat/completions", response_model=None)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, ctx: ServerContext = Depends(context)
) -> JSONResponse | StreamingResponse:
    """OpenAI's chat completions."""
    prepared = await _prepare(ctx, body, ctx.check_model(body.model))
    rid = prepared.request.request_id
    if body.stream:
        outputs = generate(ctx, prepared.request)
        first = await anext(outputs)  # bad input fails here, as a 400 before any byte is sent
        return sse_response(_chunks(ctx, body, prepared, rid, first, outputs))
    result = await unless_disconnected(request, collect(ctx, prepared.request))
    choices = []
    for i, choice in enumerate(result.choices):
        translator = prepared.new_translator()
        deltas = translator.feed(choice.text)
        tail, reason = translator.finish(choice.finish_reason or "abort")
        logprobs = None
        if prepared.top_logprobs is not None:
            logprobs = chat_logprobs(choice.logprobs, prepared.top_logprobs)
        message = merge_deltas(deltas + tail)
        choices.append(
            ChatChoice(index=i, message=message, logprobs=logprobs, finish_reason=reason)
        )
    response = ChatCompletion(
        id=rid,
        created=int(time.time()),
        model=ctx.answer_name(prepared.request.adapter),
        choices=choices,
        usage=Usage.of(
            result.num_prompt_tokens, result.num_generated_tokens, result.num_cached_tokens
        ),
    )
    return JSONResponse(response.model_dump(exclude_none=True))


async def _prepare(
    ctx: ServerContext, body: ChatCompletionRequest, adapter: str | None
) -> PreparedChat:
    loaded = ctx.model.require()
    use_tools = bool(body.tools) and body.tool_choice != "none"
    tools = body.tools if use_tools else None
    prompt = await ctx.prompt_workers.run(
        loaded.renderer.prompt,
        body.messages,
        tools,
        body.add_generation_prompt,
        body.chat_template_kwargs,
    )
    guide = await _guide(ctx, loaded.grammars, body, tools is not None)
    top = (body.top_logprobs or 0) if body.logprobs else None
    params = sampling_params(
        body,
        max_tokens=body.completion_limit,
        logprobs=top,
        guide_factory=guide.factory() if guide else None,
    )
    known = {t.function.name for t in tools or []}
    tool_choice = body.tool_choice if use_tools else None
    request = EngineRequest(
        request_id("chatcmpl"),
        prompt.token_ids,
        params,
        body.cache_salt,
        priority=body.priority,
        adapter=adapter,
        images=prompt.images,
    )
    return PreparedChat(request, lambda: translator_for(tool_choice, known), top)


async def _guide(
    ctx: ServerContext, grammars: GrammarCompiler, body: ChatCompletionRequest, use_tools: bool
) -> CompiledGuide | None:
    forced = use_tools and body.tool_choice not in (None, "auto", "none")
    try:
        if forced:
            schema = forced_tool_schema(
                body.tools or [], body.tool_choice, body.parallel_tool_calls
            )  # type: ignore[arg-type]
            return await ctx.grammar_workers.run(grammars.json_schema, schema)
        fmt = body.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return await ctx.grammar_workers.run(grammars.json_object)
        assert fmt.json_schema is not None and fmt.json_schema.schema_ is not None
        return await ctx.grammar_workers.run(grammars.json_schema, fmt.json_schema.schema_)
    except GrammarError as exc:
        param = "tools" if forced else "response_format"
        raise invalid_request(str(exc), param=param) from exc


async def _chunks(
    ctx: ServerContext,
    body: ChatCompletionRequest,
    prepared: PreparedChat,
    rid: str,
    first: RequestOutput,
    rest: AsyncIterator[RequestOutput],
) -> AsyncIterator[ChatCompletionChunk]:
    created, model = int(time.time()), ctx.answer_name(prepared.request.adapter)

    def chunk(choices: list[ChatChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=rid, created=created, model=model, choices=choices, usage=usage
        )

    options = body.stream_options
    continuous = options is not None and options.continuous_usage_stats
    n = prepared.request.params.n
    translators = [prepared.new_translator() for _ in range(n)]
    for i in range(n):
        yield chunk([ChatChunkChoice(index=i, delta=ChatDelta(role="assistant", content=""))])
    generated = 0
    output = first
    try:
        while True:
            generated += sum(len(d.token_ids) for d in output.outputs)
            usage = Usage.of(output.num_prompt_tokens, generated, output.num_cached_tokens)
            for delta in output.outputs:
                for piece in _choice_chunks(delta, translators[delta.index], prepared.top_logprobs):
                    yield chunk([piece], usage if continuous else None)
            if output.finished:
                break
            output = await anext(rest)
    finally:
        await rest.aclose()
    if options is not None and options.include_usage:
        yield chunk([], usage)


def _choice_chunks(delta, translator: ChoiceTranslator, top: int | None) -> list[ChatChunkChoice]:
    pieces = translator.feed(delta.text)
    reason = None
    if delta.finish_reason is not None:
        tail, reason = translator.finish(delta.finish_reason)
        pieces += tail
    logprobs = chat_logprobs(delta.logprobs, top) if top is not None and delta.logprobs else None
    if not pieces and (logprobs is not None or reason is not None):
        pieces = [ChatDelta()]
    return [
        ChatChunkChoice(
            index=delta.index,
            delta=piece,
            logprobs=logprobs if n == 0 else None,
            finish_reason=reason if n == len(pieces) - 1 else None,
        )
        for n, piece in enumerate(pieces)
    ]
