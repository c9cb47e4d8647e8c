"""``POST /v1/embeddings``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from inhouse.api.common import ProtocolModel

MAX_EMBEDDING_INPUTS = 2048


class EmbeddingRequest(ProtocolModel):
    """Text (or token ids) to embed; a list embeds a batch."""

    model: str | None = None
    input: (
        str
        | Annotated[list[str], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]
        | Annotated[list[int], Field(min_length=1)]
        | Annotated[list[list[int]], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]
    )
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
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
