"""What the engine hands back each step.

``SequenceOutput`` / ``CoreOutput``: the engine thread's news, token ids only (written by
``Scheduler.update``). ``RequestOutput``: per-request deltas of text, tokens and logprobs,
made from them by the ``OutputProcessor`` on the caller's side. ``Finish``: what that
processor ended (a stop string, a failure) going back to the core.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inhouse.engine.stats import RequestTiming


@dataclass(slots=True)
class SequenceOutput:
    """One sequence's news from one step: the token it sampled and whether it finished.

    ``error`` says why the sequence (and with it its request) failed; the engine goes on.
    """

    index: int
    token_id: int | None = None
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    error: str | None = None


@dataclass(slots=True)
class CoreOutput:
    """One step's news for one request, as the engine thread sends it; the prefix-cache
    hit and first scheduling come with the leader's (index 0) news."""

    request_id: str
    seqs: list[SequenceOutput]
    num_cached_tokens: int | None = None
    first_scheduled_time: float | None = None


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

    ``finish_reason`` is "stop", "length", "abort" or "error" on the last delta;
    ``stop_reason`` is the matched stop string or stop token id (None for EOS and length).
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

    The finished output carries ``timing`` (arrival, first scheduled, first token, end);
    ``error`` is set when the request failed inside the engine (the others went on).
    """

    request_id: str
    outputs: list[CompletionOutput]
    num_prompt_tokens: int
    num_cached_tokens: int
    finished: bool
    timing: RequestTiming | None = None
    error: str | None = None


@dataclass(slots=True, frozen=True)
class Finish:
    """Tell the engine to finish a sequence (``index``) or, with index None, a whole request."""

    request_id: str
    index: int | None
    reason: str
    stop_reason: str | None = None
