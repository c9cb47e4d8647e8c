"""Pieces shared by the request protocols: base models, sampling fields, usage, options."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from inhouse.api.body import NOT_AN_OBJECT, tree_problem
from inhouse.api.bounds import (
    DEFAULT_MIN_TOKENS,
    DEFAULT_N,
    Choices,
    LogitBias,
    MinP,
    MinTokens,
    Penalty,
    Priority,
    RepetitionPenalty,
    Seed,
    Stop,
    StopTokenIds,
    Temperature,
    TopK,
    TopP,
)


class ProtocolModel(BaseModel):
    """Base of request models: unknown fields are ignored, as vLLM and OpenAI SDKs expect,
    and a field sent as ``null`` is a field left out (it gets its documented default)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        if isinstance(data, dict) and None in data.values():
            return {key: value for key, value in data.items() if value is not None}
        return data


class RequestModel(ProtocolModel):
    """A whole request body: refused before field checks if it is not a JSON object, is
    nested too deep or holds text that is not valid Unicode."""

    @model_validator(mode="before")
    @classmethod
    def _check_tree(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError(NOT_AN_OBJECT)
        problem = tree_problem(data)
        if problem is not None:
            raise ValueError(problem)
        return data


class StreamOptions(ProtocolModel):
    """``stream_options``: ``include_usage`` adds a final chunk with usage and no choices."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


class SamplingFields(RequestModel):
    """Sampling parameters common to chat and completions, with the ranges of ``bounds``."""

    model: str | None = None
    n: Choices = DEFAULT_N
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    min_p: MinP | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    seed: Seed | None = None
    logit_bias: LogitBias | None = None
    stop: Stop | None = None
    stop_token_ids: StopTokenIds | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: MinTokens = DEFAULT_MIN_TOKENS
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    cache_salt: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    priority: Priority = 0

    @field_validator("stop")
    @classmethod
    def _stop_as_list(cls, value: str | list[str] | None) -> list[str] | None:
        return [value] if isinstance(value, str) else value


class PromptTokensDetails(BaseModel):
    """How many prompt tokens came from the prefix cache."""

    cached_tokens: int = 0


class Usage(BaseModel):
    """Token accounting of one response."""

    prompt_tokens: int
    completion_tokens: int = 0
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def of(cls, prompt: int, generated: int, cached: int) -> Usage:
        """Usage from token counts, with the prefix-cache hits in the details."""
        return cls(
            prompt_tokens=prompt,
            completion_tokens=generated,
            total_tokens=prompt + generated,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
        )
