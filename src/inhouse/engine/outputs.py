"""What the engine hands back each step: per-request deltas of text, tokens and logprobs."""

from __future__ import annotations

from dataclasses import dataclass, field

from inhouse.engine.stats import RequestTiming


@dataclass(slots=True)
class TokenLogprob:
    """One generated token's logprob and, when asked for, the most likely alternatives."""

    token_id: int
    token: str
    logprob: float
    top: list[tuple[int, str, float]] = field(default_factory=list)


@dataclass(slots=True)
class CompletionOutput:
    """The delta of one choice (sibling ``index``) since the previous output.

    ``finish_reason`` is "stop", "length" or "abort" on the last delta; ``stop_reason``
    is the matched stop string or stop token id (None for EOS and length).
    """

    index: int
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass(slots=True)
class RequestOutput:
    """One step's news for one request; ``finished`` once every choice has finished.

    The finished output carries ``timing`` (arrival, first scheduled, first token, end).
    """

    request_id: str
    outputs: list[CompletionOutput]
    num_prompt_tokens: int
    num_cached_tokens: int
    finished: bool
    timing: RequestTiming | None = None
