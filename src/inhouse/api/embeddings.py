"""``POST /v1/embeddings``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from inhouse.api.bounds import MAX_EMBEDDING_INPUTS, Dimensions, TokenId
from inhouse.api.common import RequestModel

TokenIds = Annotated[list[TokenId], Field(min_length=1)]


class EmbeddingRequest(RequestModel):
    """Text (or token ids) to embed; a list embeds a batch. Texts must not be empty."""

    model: str | None = None
    input: (
        Annotated[str, Field(min_length=1)]
        | Annotated[
            list[Annotated[str, Field(min_length=1)]],
            Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS),
        ]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]
    )
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Dimensions | None = None
    user: str | None = None


class EmbeddingData(BaseModel):
    """One input's vector (a list of floats, or base64 of little-endian float32)."""

    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    """Tokens read by the embedding model."""

    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    """The vectors, in input order."""

    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage
