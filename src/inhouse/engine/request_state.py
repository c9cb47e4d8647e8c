"""One request inside the engine: its sibling sequences, their detokenizers, pending news."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from inhouse.engine.detokenizer import IncrementalDetokenizer
from inhouse.engine.outputs import CompletionOutput, RequestOutput, TokenLogprob
from inhouse.engine.sampling import SamplingParams
from inhouse.engine.sequence import Sequence
from inhouse.engine.stats import RequestTiming


@dataclass(slots=True)
class RequestState:
    """The ``n`` sequences of a request and the deltas gathered for them this step."""

    request_id: str
    params: SamplingParams
    seqs: list[Sequence]
    detokenizers: list[IncrementalDetokenizer]
    pending: dict[int, CompletionOutput] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return all(seq.is_finished for seq in self.seqs)

    @property
    def num_prompt_tokens(self) -> int:
        return self.seqs[0].num_prompt_tokens

    def record(self, seq: Sequence, token_id: int | None, logprob: TokenLogprob | None) -> None:
        """Add one step's token (None: none, e.g. on abort) and text to the sequence's delta."""
        delta = self.pending.get(seq.index)
        if delta is None:
            delta = CompletionOutput(
                index=seq.index,
                text="",
                token_ids=[],
                logprobs=[] if self.params.logprobs is not None else None,
            )
            self.pending[seq.index] = delta
        if token_id is not None:
            delta.token_ids.append(token_id)
        if logprob is not None and delta.logprobs is not None:
            delta.logprobs.append(logprob)
        delta.text += self.detokenizers[seq.index].take_delta(seq.is_finished)
        if seq.is_finished:
            delta.finish_reason = seq.finish_reason
            delta.stop_reason = seq.stop_reason

    def take_output(self) -> RequestOutput:
        """The gathered deltas as one RequestOutput; clears them."""
        outputs = [self.pending[i] for i in sorted(self.pending)]
        self.pending = {}
        finished = self.finished
        return RequestOutput(
            request_id=self.request_id,
            outputs=outputs,
            num_prompt_tokens=self.num_prompt_tokens,
            num_cached_tokens=self.seqs[0].num_cached_tokens,
            finished=finished,
            timing=self._timing() if finished else None,
        )

    def _timing(self) -> RequestTiming:
        leader = self.seqs[0]
        first_tokens = [s.first_token_time for s in self.seqs if s.first_token_time is not None]
        return RequestTiming(
            request_id=self.request_id,
            arrival_time=leader.arrival_time,
            first_scheduled_time=leader.first_scheduled_time,
            first_token_time=min(first_tokens) if first_tokens else None,
            finished_time=time.monotonic(),
            num_prompt_tokens=self.num_prompt_tokens,
            num_generation_tokens=sum(s.num_output_tokens for s in self.seqs),
            finish_reason=leader.finish_reason or "abort",
        )
