"""``POST /v1/embeddings``."""

from __future__ import annotations

import asyncio
import base64
from typing import TYPE_CHECKING

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from inhouse.api.embeddings import (
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
)
from inhouse.api.errors import invalid_request
from inhouse.server.context import ServerContext
from inhouse.server.generation import unless_disconnected
from inhouse.server.routes.deps import context, require_api_key

if TYPE_CHECKING:
    from inhouse.engine.embedding_scheduler import EmbeddingResult

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/embeddings", response_model=EmbeddingResponse)
async def create_embeddings(
    body: EmbeddingRequest, request: Request, ctx: ServerContext = Depends(context)
) -> Response:
    """Unit-norm sentence embeddings, in input order. The inputs run in the embedding
    scheduler's steps, beside other requests'; if the client leaves, the rest never run."""
    scheduler = await ctx.embedding_model(body.model)
    embedder = scheduler.embedder
    inputs = body.input
    if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)):
        inputs = [inputs]  # type: ignore[list-item]
    vocab = embedder.tokenizer.vocab_size
    if any(isinstance(x, list) and not all(0 <= t < vocab for t in x) for x in inputs):
        raise invalid_request(f"Token ids must be in [0, {vocab}).", param="input")
    if body.dimensions is not None and body.dimensions > embedder.dimensions:
        raise invalid_request(
            f"dimensions must be at most {embedder.dimensions} for {embedder.name!r}.",
            param="dimensions",
        )
    job = scheduler.submit(inputs)  # type: ignore[arg-type]
    try:
        result = await unless_disconnected(request, asyncio.wrap_future(job.future))
    finally:
        job.cancel()  # the client left, or the request failed: drop what has not run
        ctx.heap.note()
    # 2,048 vectors of floats take ~0.6 s to write as JSON: not on the event loop
    content = await ctx.prompt_workers.run(_response_json, result, body, embedder.name)
    return Response(content, media_type="application/json")


def _response_json(result: EmbeddingResult, body: EmbeddingRequest, model: str) -> bytes:
    vectors, tokens = result.vectors, result.prompt_tokens
    if body.dimensions is not None:
        vectors = vectors[:, : body.dimensions]
        vectors = vectors / vectors.norm(dim=1, keepdim=True).clamp(min=1e-12)
    data = [
        EmbeddingData(index=i, embedding=_encode(row, body.encoding_format))
        for i, row in enumerate(vectors.tolist())
    ]
    usage = EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens)
    response = EmbeddingResponse(data=data, model=model, usage=usage)
    return response.model_dump_json().encode()


def _encode(row: list[float], encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(np.asarray(row, dtype="<f4").tobytes()).decode()
    return row
