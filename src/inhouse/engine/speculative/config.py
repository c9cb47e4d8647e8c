"""SpeculativeConfig: ``--speculative-config`` in vLLM's spelling, checked on construction.

``{"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": N,
"prompt_lookup_min": M}`` drafts by prompt lookup; ``{"model": PATH,
"num_speculative_tokens": K}`` (method "draft_model", implied by ``model``) drafts with a
smaller model that shares the target's tokenizer. As in vLLM, a missing lookup bound
takes the other's value, and both default to 5. ``{"method": "suffix"}`` drafts by suffix
decoding (:mod:`~inhouse.engine.speculative.suffix`): from the request's own text or
earlier requests' outputs, with vLLM's ``suffix_decoding_max_tree_depth`` (24: the longest
match looked for), ``suffix_decoding_max_cached_requests`` (10000 outputs kept; 0: none),
``suffix_decoding_max_spec_factor`` (1.0: a draft at most that times its match's length)
and ``suffix_decoding_min_token_prob`` (0.1); ``num_speculative_tokens`` defaults to the
tree depth, at most 16.

The adaptive off-switch (ours; vLLM has none): a sequence whose drafts had an acceptance
rate below ``min_acceptance_rate`` over its last ``acceptance_window`` drafts stops
drafting for ``pause_steps`` steps, then tries again from a fresh window. And, as vLLM's
``disable_by_batch_size``: no sequence drafts while more than that many decode (None:
always draft). Verifying drafts is nearly free while a step is bound by streaming the
weights (one or a few users on a CPU) and costs full rows once the batch is large:
``benchmarks/speculative.py`` measured 1.09x at c=1 and 0.70x at c=16 with drafting
always on, hence the default of 4.

``adaptive_length`` (ours, on by default): a prompt-lookup draft is at most as long as the
n-gram that matched (:mod:`~inhouse.engine.speculative.ngram`), a draft model's as its last
draft's fate allows (:mod:`~inhouse.engine.speculative.length`); false drafts
``num_speculative_tokens`` whenever the lookup finds that many.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from inhouse.engine.errors import EngineConfigError

METHODS = ("ngram", "draft_model", "suffix")
SUFFIX_KEYS = (
    "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests",
    "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob",
)
DEFAULT_PROMPT_LOOKUP = 5
MAX_SPECULATIVE_TOKENS = 16
MAX_PROMPT_LOOKUP = 64


@dataclass(slots=True, frozen=True)
class SpeculativeConfig:
    """How to draft and when to stop drafting; see the module docstring for the keys."""

    num_speculative_tokens: int
    method: str | None = None  # None: "draft_model" when ``model`` is given, else "ngram"
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    model: str | None = None
    min_acceptance_rate: float = 0.1
    acceptance_window: int = 8
    pause_steps: int = 32
    disable_by_batch_size: int | None = 4
    adaptive_length: bool = True
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 10000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1

    def __post_init__(self) -> None:
        if self.method is None:
            object.__setattr__(self, "method", "draft_model" if self.model else "ngram")
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
        if self.method == "suffix":
            self._check_suffix()
        rate = self.min_acceptance_rate
        if not isinstance(rate, int | float) or not 0 <= rate <= 1:
            raise EngineConfigError(f"min_acceptance_rate must be in [0, 1], got {rate!r}")
        _int_in("acceptance_window", self.acceptance_window, 1, 1024)
        _int_in("pause_steps", self.pause_steps, 0, 1_000_000)
        if not isinstance(self.adaptive_length, bool):
            raise EngineConfigError(
                f"adaptive_length must be true or false, got {self.adaptive_length!r}"
            )
        if self.disable_by_batch_size is not None:
            _int_in("disable_by_batch_size", self.disable_by_batch_size, 1, 1_000_000)

    def _check_suffix(self) -> None:
        for key in ("model", "prompt_lookup_min", "prompt_lookup_max"):
            if getattr(self, key) is not None:
                raise EngineConfigError(f'"{key}" does not belong to the suffix method')
        _int_in("suffix_decoding_max_tree_depth", self.suffix_decoding_max_tree_depth, 4, 64)
        _int_in(
            "suffix_decoding_max_cached_requests",
            self.suffix_decoding_max_cached_requests,
            0,
            1_000_000,
        )
        _number_in("suffix_decoding_max_spec_factor", self.suffix_decoding_max_spec_factor, 0, 64)
        if self.suffix_decoding_max_spec_factor == 0:
            raise EngineConfigError("suffix_decoding_max_spec_factor must be above 0")
        _number_in("suffix_decoding_min_token_prob", self.suffix_decoding_min_token_prob, 0, 1)

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
        suffix = raw.get("method") == "suffix"
        stray = [key for key in SUFFIX_KEYS if key in raw and not suffix]
        if stray:
            raise EngineConfigError(f'{stray[0]} belongs to the "suffix" method')
        if "num_speculative_tokens" not in raw:
            if not suffix:
                raise EngineConfigError("--speculative-config needs num_speculative_tokens")
            depth = raw.get("suffix_decoding_max_tree_depth", MAX_SPECULATIVE_TOKENS)
            if isinstance(depth, bool) or not isinstance(depth, int):
                depth = MAX_SPECULATIVE_TOKENS  # the depth's own check names it
            raw = {**raw, "num_speculative_tokens": min(depth, MAX_SPECULATIVE_TOKENS)}
        return cls(**raw)

    def as_dict(self) -> dict[str, Any]:
        """Its keys as ``--speculative-config`` spells them (suffix ones for that method)."""
        keys = [f.name for f in fields(self)]
        if self.method != "suffix":
            keys = [key for key in keys if key not in SUFFIX_KEYS]
        return {key: getattr(self, key) for key in keys}

    def describe(self) -> str:
        """One line for the start-up table and /version."""
        if self.method == "ngram":
            lookup = f"n-grams {self.prompt_lookup_min}..{self.prompt_lookup_max}"
            return f"ngram, {self._tokens()}, {lookup}"
        if self.method == "suffix":
            depth, kept = (
                self.suffix_decoding_max_tree_depth,
                self.suffix_decoding_max_cached_requests,
            )
            return f"suffix, {self._tokens()}, matches up to {depth}, the last {kept} outputs"
        return f"draft model {self.model}, {self._tokens()}"

    def _tokens(self) -> str:
        up_to = "up to " if self.adaptive_length else ""
        return f"{up_to}{self.num_speculative_tokens} tokens"


def _number_in(name: str, value: Any, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise EngineConfigError(f"{name} must be a number in [{low}, {high}], got {value!r}")


def _int_in(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise EngineConfigError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
