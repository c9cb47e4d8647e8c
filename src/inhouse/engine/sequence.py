"""One generation stream's state: its tokens, how many are computed, the blocks it holds.

A request with ``n > 1`` becomes ``n`` sibling sequences that share ``request_id``
and differ in ``index``. Each field has one writer: ``Scheduler`` (status, token ids,
computed and cached counts, finish), ``KVCacheManager`` (block table, block hashes),
``Sampler`` (the seeded generator); the runner only reads.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inhouse.engine.images import PromptImage
    from inhouse.engine.lora.slots import LoadedAdapter
    from inhouse.engine.sampling_params import SamplingParams

_seq_ids = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    """Prompt plus generated tokens of one choice, and its place in the KV cache.

    ``token_ids[:num_computed_tokens]`` have their K/V written into the blocks of
    ``block_table`` (block ``i`` holds tokens ``i*block_size .. (i+1)*block_size-1``).
    """

    request_id: str
    token_ids: list[int]
    sampling_params: SamplingParams
    index: int = 0
    cache_salt: str | None = None
    priority: int = 0
    arrival_time: float = 0.0
    adapter: LoadedAdapter | None = None  # the LoRA adapter its tokens run with
    images: tuple[PromptImage, ...] = ()  # the prompt's images, their tokens placed
    seq_id: int = field(default_factory=lambda: next(_seq_ids))
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    first_scheduled_time: float | None = None
    last_step: int = 0  # the scheduler step that last ran it (background turns)
    generator: Any = None
    guide: Any = None

    def __post_init__(self) -> None:
        if not self.num_prompt_tokens:
            self.num_prompt_tokens = len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    # -- as the scheduling policy reads it (``inhouse.scheduling.candidate.Candidate``) ------

    @property
    def arrival(self) -> float:
        return self.arrival_time

    @property
    def tenant(self) -> str | None:
        return self.cache_salt

    @property
    def tokens_left(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def running(self) -> bool:
        return self.status is SequenceStatus.RUNNING
