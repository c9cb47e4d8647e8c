"""EngineRequest: one request as the server hands it to the engine, created once at the edge.

It crosses ``AsyncEngine`` and ``LLMEngine`` unchanged; a new field (priority, a
deadline, an adapter) is added here and read where it is used, not threaded through
every signature in between.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from inhouse.engine.images import PromptImage
from inhouse.engine.sampling_params import SamplingParams


@dataclass(slots=True, frozen=True)
class EngineRequest:
    """What to generate: prompt ids, how to sample, the tenant's cache salt, when it arrived.

    ``priority`` is vLLM's: lower is served earlier (the gateway's classes interactive,
    default and batch are -1, 0 and 1); ``cache_salt`` also names the tenant that
    ``--scheduling-policy fair`` shares the engine between (None: one anonymous tenant).
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    cache_salt: str | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    priority: int = 0
    adapter: str | None = None  # a LoRA adapter's name (the request's ``model``); None: the base
    images: tuple[PromptImage, ...] = ()  # placed in the prompt (see inhouse.engine.images)
