"""SamplingParams (what a request asks for) and the Guide protocol for constrained decoding.

The batched sampler that applies them lives in ``sampler.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from inhouse.engine.errors import EngineInputError

MAX_LOGPROBS = 20
GREEDY_TEMPERATURE = 1e-5


class InvalidSamplingParams(EngineInputError):
    """A sampling parameter outside its allowed range."""


class Guide(Protocol):
    """Grammar state of one sequence: masks what may come next, follows what came."""

    def mask_logits(self, logits_row: object) -> None:
        """Set the logits of disallowed tokens to -inf, in place."""

    def accept(self, token_id: int) -> None:
        """Advance the grammar by the sampled token."""

    def is_terminated(self) -> bool:
        """True once the grammar is complete; the sequence then finishes with "stop"."""


@dataclass(slots=True)
class SamplingParams:
    """How to pick tokens and when to stop; validated on construction.

    ``temperature`` 0 means greedy. ``top_k`` -1 disables top-k. ``max_tokens`` None
    means "up to max_model_len". ``logprobs`` None returns none, 0 only the chosen
    token's, k > 0 also the k most likely. ``seed`` makes sampling reproducible
    whatever else runs in the batch (sibling ``i`` of ``n`` uses ``seed + i``).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    guide_factory: Callable[[], Guide] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        self._validate()

    def _validate(self) -> None:
        _check(self.n >= 1, "n", f"n must be at least 1, got {self.n}")
        _check(
            math.isfinite(self.temperature) and self.temperature >= 0,
            "temperature",
            f"temperature must be a finite number >= 0, got {self.temperature}",
        )
        _check(0 < self.top_p <= 1, "top_p", f"top_p must be in (0, 1], got {self.top_p}")
        _check(
            self.top_k == -1 or self.top_k >= 1,
            "top_k",
            f"top_k must be -1 (disabled) or at least 1, got {self.top_k}",
        )
        _check(0 <= self.min_p <= 1, "min_p", f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(-2 <= value <= 2, name, f"{name} must be in [-2, 2], got {value}")
        _check(
            math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0,
            "repetition_penalty",
            f"repetition_penalty must be > 0, got {self.repetition_penalty}",
        )
        if self.max_tokens is not None:
            _check(
                self.max_tokens >= 1,
                "max_tokens",
                f"max_tokens must be at least 1, got {self.max_tokens}",
            )
        _check(
            self.min_tokens >= 0, "min_tokens", f"min_tokens must be >= 0, got {self.min_tokens}"
        )
        if self.max_tokens is not None:
            _check(
                self.min_tokens <= self.max_tokens,
                "min_tokens",
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
            )
        if self.logprobs is not None:
            _check(
                0 <= self.logprobs <= MAX_LOGPROBS,
                "logprobs",
                f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}",
            )
        _check(
            all(isinstance(s, str) and s for s in self.stop),
            "stop",
            "stop strings must be non-empty strings",
        )
        _check(
            all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids",
            "stop_token_ids must be non-negative integers",
        )

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def has_penalties(self) -> bool:
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
        )

    @property
    def truncates(self) -> bool:
        """True when top-k, top-p or min-p cut the distribution."""
        return self.top_k != -1 or self.top_p < 1 or self.min_p > 0


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise InvalidSamplingParams(message, param=param)
