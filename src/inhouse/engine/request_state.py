"""One request on the output side: its choices' detokenizers, counts, timings, pending deltas."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from inhouse.engine.detokenizer import IncrementalDetokenizer
from inhouse.engine.outputs import CompletionOutput, RequestOutput
from inhouse.engine.request import EngineRequest
from inhouse.engine.stats import RequestTiming


@dataclass(slots=True)
class ChoiceState:
    """One choice (sibling sequence) as its client sees it."""

    detokenizer: IncrementalDetokenizer
    num_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestState:
    """The ``n`` choices of a request and the deltas gathered for them since the last output."""

    request: EngineRequest
    choices: list[ChoiceState]
    num_cached_tokens: int = 0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    error: str | None = None
    pending: dict[int, CompletionOutput] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return all(choice.finished for choice in self.choices)

    def delta(self, index: int) -> CompletionOutput:
        """The choice's delta for the output being gathered."""
        delta = self.pending.get(index)
        if delta is None:
            logprobs = [] if self.request.params.logprobs is not None else None
            delta = self.pending[index] = CompletionOutput(index, "", [], logprobs)
        return delta

    def close_delta(self, index: int) -> None:
        """Move the choice's releasable text into its delta, with its finish once finished."""
        choice = self.choices[index]
        delta = self.delta(index)
        delta.text += choice.detokenizer.take_delta(choice.finished)
        if choice.finished:
            delta.finish_reason = choice.finish_reason
            delta.stop_reason = choice.stop_reason

    def fail(self, error: str) -> None:
        """End every unfinished choice with "error"."""
        self.error = error
        for index, choice in enumerate(self.choices):
            if not choice.finished:
                choice.finish_reason = "error"
                self.close_delta(index)

    def take_output(self) -> RequestOutput:
        """The gathered deltas as one RequestOutput; clears them."""
        outputs = [self.pending[i] for i in sorted(self.pending)]
        self.pending = {}
        finished = self.finished
        return RequestOutput(
            request_id=self.request.request_id,
            outputs=outputs,
            num_prompt_tokens=len(self.request.prompt_token_ids),
            num_cached_tokens=self.num_cached_tokens,
            finished=finished,
            timing=self._timing() if finished else None,
            error=self.error,
        )

    def _timing(self) -> RequestTiming:
        return RequestTiming(
            request_id=self.request.request_id,
            arrival_time=self.request.arrival_time,
            first_scheduled_time=self.first_scheduled_time,
            first_token_time=self.first_token_time,
            finished_time=time.monotonic(),
            num_prompt_tokens=len(self.request.prompt_token_ids),
            num_generation_tokens=sum(choice.num_tokens for choice in self.choices),
            finish_reason=self.choices[0].finish_reason or "abort",
        )
