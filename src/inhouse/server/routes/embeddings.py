"""``POST /v1/embeddings``."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
from fastapi import APIRouter, Depends

from inhouse.api.embeddings import (
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingUsage,
)
from inhouse.api.errors import invalid_request
from inhouse.server.context import ServerContext
from inhouse.server.routes.deps import context, require_api_key

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/embeddings")
async def create_embeddings(
    body: EmbeddingRequest, ctx: ServerContext = Depends(context)
) -> EmbeddingResponse:
    """Unit-norm sentence embeddings, in input order."""
    embedder = await ctx.embedding_model(body.model)
    inputs = body.input
    if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)):
        inputs = [inputs]  # type: ignore[list-item]
    vocab = embedder.tokenizer.vocab_size
    if any(isinstance(x, list) and not all(0 <= t < vocab for t in x) for x in inputs):
        raise invalid_request(f"Token ids must be in [0, {vocab}).", param="input")
    vectors, tokens = await asyncio.to_thread(embedder.embed, inputs)  # type: ignore[arg-type]
    if body.dimensions is not None:
        if body.dimensions > embedder.dimensions:
            raise invalid_request(
                f"dimensions must be at most {embedder.dimensions} for {embedder.name!r}.",
                param="dimensions",
            )
        vectors = vectors[:, : body.dimensions]
        vectors = vectors / vectors.norm(dim=1, keepdim=True).clamp(min=1e-12)
    data = [
        EmbeddingData(index=i, embedding=_encode(row, body.encoding_format))
        for i, row in enumerate(vectors.tolist())
    ]
    usage = EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens)
    return EmbeddingResponse(data=data, model=embedder.name, usage=usage)


def _encode(row: list[float], encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(np.asarray(row, dtype="<f4").tobytes()).decode()
    return row
