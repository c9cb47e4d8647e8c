"""OpenAI request fields to the engine's ``SamplingParams``."""

from __future__ import annotations

from collections.abc import Callable

from inhouse.api.common import SamplingFields
from inhouse.api.errors import APIError, invalid_request
from inhouse.engine.errors import EngineInputError
from inhouse.engine.sampling import Guide, SamplingParams

DEFAULT_TEMPERATURE = 1.0


def sampling_params(
    request: SamplingFields,
    *,
    max_tokens: int | None,
    logprobs: int | None,
    guide_factory: Callable[[], Guide] | None = None,
) -> SamplingParams:
    """The engine's parameters for ``request``; bad combinations become a 400."""
    try:
        return SamplingParams(
            n=request.n,
            temperature=DEFAULT_TEMPERATURE if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            top_k=-1 if request.top_k in (None, 0) else request.top_k,
            min_p=request.min_p or 0.0,
            presence_penalty=request.presence_penalty or 0.0,
            frequency_penalty=request.frequency_penalty or 0.0,
            repetition_penalty=request.repetition_penalty or 1.0,
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


def engine_input_error(exc: EngineInputError) -> APIError:
    """The 400 for input the engine refused (prompt too long, bad parameter, ...)."""
    return invalid_request(exc.message, param=exc.param)
