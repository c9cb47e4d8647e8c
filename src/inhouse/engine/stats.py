"""Engine and embedding-model counters and per-request timings, read by the server's
/metrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inhouse.engine.speculative.drafter import SpecDecodeCounters


@dataclass(slots=True, frozen=True)
class EngineStats:
    """A snapshot of the engine's gauges and monotonically increasing counters."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_blocks: int
    block_size: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    prompt_tokens: int
    generation_tokens: int
    num_steps: int
    finished_requests: dict[str, int] = field(default_factory=dict)
    preemptions_by_cause: dict[str, int] = field(default_factory=dict)  # "kv", "priority"
    spec_decode: SpecDecodeCounters | None = None  # None: speculative decoding is off
    abandoned_steps: int = 0  # steps stopped for a better request (see step_interrupt)
    abandoned_tokens: int = 0  # the tokens those steps had scheduled, computed again later
    images_encoded: int = 0  # images the vision encoder ran over (a prefix-cache hit skips it)
    image_encode_seconds: float = 0.0  # the time those encodings took


@dataclass(slots=True, frozen=True)
class RequestTiming:
    """Monotonic timestamps of one finished request, for TTFT/queue/e2e histograms."""

    request_id: str
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finished_time: float
    num_prompt_tokens: int
    num_generation_tokens: int
    finish_reason: str

    @property
    def queue_time(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def time_to_first_token(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float:
        return self.finished_time - self.arrival_time


@dataclass(slots=True, frozen=True)
class EmbeddingStats:
    """A snapshot of the embedding scheduler: its queue and what it has computed."""

    unfinished: int  # requests queued or running
    inputs: int  # inputs embedded since start
    tokens: int  # tokens those inputs held
