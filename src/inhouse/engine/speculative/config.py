"""SpeculativeConfig: ``--speculative-config`` in vLLM's spelling, checked on construction.

``{"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": N,
"prompt_lookup_min": M}`` drafts by prompt lookup; ``{"model": PATH,
"num_speculative_tokens": K}`` (method "draft_model", implied by ``model``) drafts with a
smaller model that shares the target's tokenizer. As in vLLM, a missing lookup bound
takes the other's value, and both default to 5.

The adaptive off-switch (ours; vLLM has none): a sequence whose drafts had an acceptance
rate below ``min_acceptance_rate`` over its last ``acceptance_window`` drafts stops
drafting for ``pause_steps`` steps, then tries again from a fresh window.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from inhouse.engine.errors import EngineConfigError

METHODS = ("ngram", "draft_model")
DEFAULT_PROMPT_LOOKUP = 5
MAX_SPECULATIVE_TOKENS = 16
MAX_PROMPT_LOOKUP = 64


@dataclass(slots=True, frozen=True)
class SpeculativeConfig:
    """How to draft and when to stop drafting; see the module docstring for the keys."""

    num_speculative_tokens: int
    method: str = "ngram"
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    model: str | None = None
    min_acceptance_rate: float = 0.1
    acceptance_window: int = 8
    pause_steps: int = 32

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise EngineConfigError(
                f"speculative method {self.method!r} is not supported; use {' or '.join(METHODS)}"
            )
        _int_in("num_speculative_tokens", self.num_speculative_tokens, 1, MAX_SPECULATIVE_TOKENS)
        if self.method == "draft_model" and not self.model:
            raise EngineConfigError('the "draft_model" method needs "model": a path')
        if self.method == "ngram":
            if self.model is not None:
                raise EngineConfigError('"model" belongs to the draft_model method, not ngram')
            high = self.prompt_lookup_max or self.prompt_lookup_min or DEFAULT_PROMPT_LOOKUP
            low = self.prompt_lookup_min or self.prompt_lookup_max or DEFAULT_PROMPT_LOOKUP
            object.__setattr__(self, "prompt_lookup_max", high)
            object.__setattr__(self, "prompt_lookup_min", low)
            _int_in("prompt_lookup_min", low, 1, MAX_PROMPT_LOOKUP)
            _int_in("prompt_lookup_max", high, 1, MAX_PROMPT_LOOKUP)
            if low > high:
                raise EngineConfigError(
                    f"prompt_lookup_min ({low}) must not exceed prompt_lookup_max ({high})"
                )
        rate = self.min_acceptance_rate
        if not isinstance(rate, int | float) or not 0 <= rate <= 1:
            raise EngineConfigError(f"min_acceptance_rate must be in [0, 1], got {rate!r}")
        _int_in("acceptance_window", self.acceptance_window, 1, 1024)
        _int_in("pause_steps", self.pause_steps, 0, 1_000_000)

    @classmethod
    def parse(cls, text: str) -> SpeculativeConfig:
        """From the JSON object ``--speculative-config`` takes; unknown keys are refused."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as error:
            raise EngineConfigError(f"--speculative-config is not JSON: {error}") from None
        if not isinstance(raw, dict):
            raise EngineConfigError("--speculative-config must be a JSON object")
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SpeculativeConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise EngineConfigError(
                f"unknown --speculative-config keys: {', '.join(unknown)}; "
                f"known: {', '.join(sorted(known))}"
            )
        if "num_speculative_tokens" not in raw:
            raise EngineConfigError("--speculative-config needs num_speculative_tokens")
        values = dict(raw)
        if "method" not in values:
            values["method"] = "draft_model" if values.get("model") else "ngram"
        return cls(**values)

    def describe(self) -> str:
        """One line for the start-up table and /version."""
        if self.method == "ngram":
            lookup = f"n-grams {self.prompt_lookup_min}..{self.prompt_lookup_max}"
            return f"ngram, {self.num_speculative_tokens} tokens, {lookup}"
        return f"draft model {self.model}, {self.num_speculative_tokens} tokens"


def _int_in(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise EngineConfigError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
