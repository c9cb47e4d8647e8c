"""OpenAI request fields to the engine's ``SamplingParams``."""

from __future__ import annotations

from collections.abc import Callable

from inhouse.api import bounds
from inhouse.api.common import SamplingFields
from inhouse.api.errors import APIError, invalid_request
from inhouse.engine.errors import EngineInputError
from inhouse.engine.sampling_params import Guide, SamplingParams


def sampling_params(
    request: SamplingFields,
    *,
    max_tokens: int | None,
    logprobs: int | None,
    guide_factory: Callable[[], Guide] | None = None,
) -> SamplingParams:
    """The engine's parameters for ``request``; bad combinations become a 400."""
    if request.logit_bias:
        raise invalid_request("logit_bias is not supported by this server.", param="logit_bias")
    try:
        return SamplingParams(
            n=request.n,
            temperature=_or(request.temperature, bounds.DEFAULT_TEMPERATURE),
            top_p=_or(request.top_p, bounds.DEFAULT_TOP_P),
            top_k=bounds.DEFAULT_TOP_K if request.top_k in (None, 0) else request.top_k,
            min_p=_or(request.min_p, bounds.DEFAULT_MIN_P),
            presence_penalty=_or(request.presence_penalty, bounds.DEFAULT_PRESENCE_PENALTY),
            frequency_penalty=_or(request.frequency_penalty, bounds.DEFAULT_FREQUENCY_PENALTY),
            repetition_penalty=_or(request.repetition_penalty, bounds.DEFAULT_REPETITION_PENALTY),
            seed=request.seed,
            stop=list(request.stop or []),
            stop_token_ids=list(request.stop_token_ids or []),
            include_stop_str_in_output=request.include_stop_str_in_output,
            max_tokens=max_tokens,
            min_tokens=request.min_tokens,
            ignore_eos=request.ignore_eos,
            logprobs=logprobs,
            skip_special_tokens=request.skip_special_tokens,
            guide_factory=guide_factory,
        )
    except EngineInputError as exc:
        raise engine_input_error(exc) from exc


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def engine_input_error(exc: EngineInputError) -> APIError:
    """The 400 for input the engine refused (prompt too long, bad parameter, ...)."""
    return invalid_request(exc.message, param=exc.param)
