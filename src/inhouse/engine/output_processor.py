"""OutputProcessor: token-id news from the engine thread to text deltas, on the caller's side.

It owns every request's output state: incremental detokenizers, stop strings, logprob
text, token counts and timings. A stop string it finds ends the choice at once for the
client and becomes a ``Finish`` sent back to the engine, which frees the sequence one
step late (as vLLM v1 does); tokens the engine made meanwhile are dropped here. In
``AsyncEngine`` it runs on the asyncio side, so the engine thread never detokenizes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from inhouse.engine.detokenizer import IncrementalDetokenizer
from inhouse.engine.outputs import (
    CompletionOutput,
    CoreOutput,
    Finish,
    RequestOutput,
    SequenceOutput,
    TokenLogprob,
)
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


class OutputProcessor:
    """Per-request output state for every request in flight."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._states: dict[str, RequestState] = {}
        self._token_text: dict[int, str] = {}

    def add(self, request: EngineRequest) -> None:
        params = request.params
        choices = [
            ChoiceState(
                IncrementalDetokenizer(
                    self._tokenizer,
                    request.prompt_token_ids,
                    stop=params.stop,
                    include_stop_str_in_output=params.include_stop_str_in_output,
                    skip_special_tokens=params.skip_special_tokens,
                )
            )
            for _ in range(params.n)
        ]
        self._states[request.request_id] = RequestState(request, choices)

    def drop(self, request_id: str) -> None:
        """Forget a request (its consumer left)."""
        self._states.pop(request_id, None)

    def has_unfinished(self) -> bool:
        return bool(self._states)

    def process(self, out: CoreOutput) -> tuple[RequestOutput | None, list[Finish]]:
        """The request's output for this news (None if it already ended here), and what the
        engine must finish because of it."""
        state = self._states.get(out.request_id)
        if state is None:
            return None, []
        try:
            finishes = self._apply(state, out)
        except Exception as error:  # detokenizing failed: this request ends, the others go on
            state.fail(f"{type(error).__name__}: {error}")
            finishes = [Finish(out.request_id, None, "error")]
        output = state.take_output()
        if output.finished:
            del self._states[out.request_id]
        return output, finishes

    def _apply(self, state: RequestState, out: CoreOutput) -> list[Finish]:
        if out.num_cached_tokens is not None:
            state.num_cached_tokens = out.num_cached_tokens
            state.first_scheduled_time = out.first_scheduled_time
        finishes = []
        for news in out.seqs:
            choice = state.choices[news.index]
            if choice.finished:  # a stop string ended it; the engine ran one step more
                continue
            if news.error is not None:
                state.fail(news.error)
                return []
            if news.token_id is not None:
                self._add_token(state, choice, news)
            if not choice.finished:
                choice.finish_reason, choice.stop_reason = news.finish_reason, news.stop_reason
            elif news.finish_reason is None:
                finishes.append(Finish(out.request_id, news.index, "stop", choice.stop_reason))
            state.close_delta(news.index)
        return finishes

    def _add_token(self, state: RequestState, choice: ChoiceState, news: SequenceOutput) -> None:
        token_id = news.token_id
        assert token_id is not None
        params = state.request.params
        delta: CompletionOutput = state.delta(news.index)
        choice.num_tokens += 1
        delta.token_ids.append(token_id)
        if state.first_token_time is None:
            state.first_token_time = time.monotonic()
        if news.logprob is not None and delta.logprobs is not None:
            top = [(t, self._text_of(t), lp) for t, lp in news.top or []]
            delta.logprobs.append(
                TokenLogprob(token_id, self._text_of(token_id), news.logprob, top)
            )
        detok = choice.detokenizer
        if news.finish_reason == "stop":  # EOS, a stop token id, or the grammar's end
            if news.stop_reason is not None and params.include_stop_str_in_output:
                detok.add_token(token_id, check_stop=False)
            return
        detok.add_token(token_id, check_stop=choice.num_tokens >= params.min_tokens)
        if detok.stop_string is not None:
            choice.finish_reason, choice.stop_reason = "stop", detok.stop_string

    def _text_of(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id])
            self._token_text[token_id] = text
        return text
