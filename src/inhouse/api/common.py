"""Pieces shared by the chat and completions protocols: sampling fields, usage, options."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_N = 16
MAX_TOP_LOGPROBS = 20


class ProtocolModel(BaseModel):
    """Base of request models: unknown fields are ignored, as vLLM and OpenAI SDKs expect."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class StreamOptions(ProtocolModel):
    """``stream_options``: ``include_usage`` adds a final chunk with usage and no choices."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


class SamplingFields(ProtocolModel):
    """Sampling parameters common to chat and completions, with OpenAI's and vLLM's ranges."""

    model: str | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0)] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0)] = 0
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    cache_salt: Annotated[str, Field(min_length=1, max_length=1024)] | None = None

    @field_validator("stop")
    @classmethod
    def _stop_as_list(cls, value: str | list[str] | None) -> list[str] | None:
        if value is None:
            return None
        stops = [value] if isinstance(value, str) else value
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        if len(stops) > 16:
            raise ValueError("at most 16 stop strings are allowed")
        return stops


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
