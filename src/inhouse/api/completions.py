"""``POST /v1/completions``: the legacy text-completion protocol."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

from inhouse.api.bounds import (
    DEFAULT_COMPLETIONS_MAX_TOKENS,
    MAX_COMPLETION_PROMPTS,
    Choices,
    Logprobs,
    OutputTokens,
    TokenId,
)
from inhouse.api.common import SamplingFields, Usage

TokenIds = Annotated[list[TokenId], Field(min_length=1)]


class CompletionRequest(SamplingFields):
    """The body of ``POST /v1/completions``; ``prompt`` is text, token ids, or a batch of them."""

    prompt: (
        str
        | Annotated[list[str], Field(min_length=1, max_length=MAX_COMPLETION_PROMPTS)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_COMPLETION_PROMPTS)]
    )
    max_tokens: OutputTokens | None = DEFAULT_COMPLETIONS_MAX_TOKENS
    max_completion_tokens: OutputTokens | None = None  # the chat name, taken here too
    logprobs: Logprobs | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: Choices | None = None

    @model_validator(mode="after")
    def _check_unsupported(self) -> CompletionRequest:
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of different from n is not supported")
        return self

    @property
    def completion_limit(self) -> int | None:
        """``max_completion_tokens``, else ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens

    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list of prompts (each text or token ids)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


class CompletionLogprobs(BaseModel):
    """Legacy logprobs: parallel lists per generated token."""

    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []


class CompletionChoice(BaseModel):
    """One generated text."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class Completion(BaseModel):
    """A completions response, or one SSE chunk of it (same shape)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
