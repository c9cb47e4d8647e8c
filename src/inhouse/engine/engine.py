"""LLMEngine: requests in, one batched step at a time, per-request deltas out.

``add_request`` validates and queues; ``step`` schedules, runs one forward for the
whole batch, samples, detokenizes and checks stops; ``abort`` frees at once.
Single-threaded: ``AsyncEngine`` drives it from its own thread.
"""

from __future__ import annotations

import logging
import time
from collections import Counter

from inhouse.engine.config import EngineConfig
from inhouse.engine.detokenizer import IncrementalDetokenizer
from inhouse.engine.errors import EngineInputError
from inhouse.engine.kv_budget import KVBudget, plan_kv_budget
from inhouse.engine.kv_cache import KVCacheManager
from inhouse.engine.models.loader import LoadedModel, load_model
from inhouse.engine.outputs import RequestOutput, TokenLogprob
from inhouse.engine.request_state import RequestState
from inhouse.engine.runner import ModelRunner
from inhouse.engine.sampler import SampledToken, Sampler
from inhouse.engine.sampling import SamplingParams
from inhouse.engine.scheduler import Scheduler
from inhouse.engine.sequence import Sequence
from inhouse.engine.stats import EngineStats

log = logging.getLogger(__name__)

MAX_CACHE_SALT_CHARS = 1024


class LLMEngine:
    """The synchronous engine: one model, one KV cache, one scheduler."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        self.config = config
        self.loaded = loaded or load_model(
            config.model, config.dtype, config.device, quantization=config.quantization
        )
        self.tokenizer = self.loaded.tokenizer
        self.budget: KVBudget = plan_kv_budget(config, self.loaded)
        self.max_model_len = self.budget.max_model_len
        self.runner = ModelRunner(self.loaded, self.budget.num_blocks, config.block_size)
        self.kv_cache = KVCacheManager(
            self.budget.num_blocks, config.block_size, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            self.kv_cache, config.max_num_seqs, config.max_num_batched_tokens
        )
        self.sampler = Sampler(config.seed)
        self.eos_token_ids = frozenset(self.loaded.eos_token_ids)
        self.vocab_size = int(self.loaded.hf_config.vocab_size)
        self._requests: dict[str, RequestState] = {}
        self._token_text: dict[int, str] = {}
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._num_steps = 0
        self._finished_requests: Counter[str] = Counter()

    # -- requests ---------------------------------------------------------------------

    def validate_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        cache_salt: str | None = None,
    ) -> None:
        """Raise EngineInputError for a request the engine cannot serve; touches nothing."""
        if not isinstance(params, SamplingParams):
            raise EngineInputError("params must be SamplingParams", param="params")
        if request_id in self._requests:
            raise EngineInputError(f"request id {request_id!r} is already running")
        num_prompt = len(prompt_token_ids)
        if num_prompt == 0:
            raise EngineInputError("the prompt is empty; it needs at least one token", "prompt")
        if num_prompt >= self.max_model_len:
            raise EngineInputError(
                f"the prompt has {num_prompt} tokens, but max_model_len is "
                f"{self.max_model_len} and at least one token must be left for the output",
                "prompt",
            )
        if params.max_tokens is not None and num_prompt + params.max_tokens > self.max_model_len:
            raise EngineInputError(
                f"the prompt ({num_prompt} tokens) plus max_tokens ({params.max_tokens}) is "
                f"{num_prompt + params.max_tokens} tokens, more than max_model_len "
                f"{self.max_model_len}",
                "max_tokens",
            )
        for param, ids in (("prompt", prompt_token_ids), ("stop_token_ids", params.stop_token_ids)):
            if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in ids):
                raise EngineInputError(
                    f"{param} token ids must be integers in [0, {self.vocab_size})", param
                )
        if cache_salt is not None and not 1 <= len(cache_salt) <= MAX_CACHE_SALT_CHARS:
            raise EngineInputError(
                f"cache_salt must have 1 to {MAX_CACHE_SALT_CHARS} characters", "cache_salt"
            )

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        cache_salt: str | None = None,
    ) -> None:
        """Validate and queue a request (``params.n`` sibling sequences)."""
        self.validate_request(request_id, prompt_token_ids, params, cache_salt)
        prompt = list(prompt_token_ids)
        seqs = [
            Sequence(
                request_id=request_id,
                token_ids=list(prompt),
                sampling_params=params,
                index=i,
                cache_salt=cache_salt,
                guide=params.guide_factory() if params.guide_factory else None,
            )
            for i in range(params.n)
        ]
        detokenizers = [
            IncrementalDetokenizer(
                self.tokenizer,
                prompt,
                stop=params.stop,
                include_stop_str_in_output=params.include_stop_str_in_output,
                skip_special_tokens=params.skip_special_tokens,
            )
            for _ in seqs
        ]
        self._requests[request_id] = RequestState(request_id, params, seqs, detokenizers)
        self.scheduler.add(seqs)
        self._prompt_tokens += len(prompt)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now and free its blocks; returns its final output (None if unknown)."""
        state = self._requests.get(request_id)
        if state is None:
            return None
        for seq in state.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")
                state.record(seq, None, None)
        return self._close(state)

    def has_unfinished(self) -> bool:
        return bool(self._requests)

    # -- the step ---------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one scheduled batch; return the news of every request it touched."""
        plan = self.scheduler.schedule()
        if not plan.scheduled:
            return []
        logits = self.runner.execute(plan.scheduled)
        self._num_steps += 1
        rows: list[int] = []
        ready: list[Sequence] = []
        for row, (seq, num_tokens) in enumerate(plan.scheduled):
            seq.num_computed_tokens += num_tokens
            self.kv_cache.cache_computed_blocks(seq)
            if seq.num_computed_tokens == seq.num_tokens:
                rows.append(row)
                ready.append(seq)
        if not ready:
            return []
        if len(rows) < len(plan.scheduled):
            logits = logits[rows]
        sampled = self.sampler(logits, ready, self.eos_token_ids)
        now = time.monotonic()
        touched: dict[str, RequestState] = {}
        for seq, token in zip(ready, sampled, strict=True):
            state = self._requests[seq.request_id]
            self._append_token(seq, token, now)
            state.record(seq, token.token_id, self._token_logprob(token))
            touched[seq.request_id] = state
        self._generation_tokens += len(ready)
        return [self._close(s) if s.finished else s.take_output() for s in touched.values()]

    def _append_token(self, seq: Sequence, token: SampledToken, now: float) -> None:
        token_id = token.token_id
        seq.token_ids.append(token_id)
        if seq.first_token_time is None:
            seq.first_token_time = now
        params = seq.sampling_params
        if seq.guide is not None:
            seq.guide.accept(token_id)
        may_stop = seq.num_output_tokens >= params.min_tokens
        detok = self._requests[seq.request_id].detokenizers[seq.index]
        if may_stop and not params.ignore_eos and token_id in self.eos_token_ids:
            self.scheduler.finish(seq, "stop")
            return
        if may_stop and token_id in params.stop_token_ids:
            if params.include_stop_str_in_output:
                detok.add_token(token_id, check_stop=False)
            self.scheduler.finish(seq, "stop", token_id)
            return
        detok.add_token(token_id, check_stop=may_stop)
        if detok.stop_string is not None:
            self.scheduler.finish(seq, "stop", detok.stop_string)
        elif seq.guide is not None and seq.guide.is_terminated():
            self.scheduler.finish(seq, "stop")
        elif (
            params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens
        ) or seq.num_tokens >= self.max_model_len:
            self.scheduler.finish(seq, "length")

    def _token_logprob(self, token: SampledToken) -> TokenLogprob | None:
        if token.logprob is None:
            return None
        top = [(t, self._text_of(t), lp) for t, lp in token.top or []]
        return TokenLogprob(token.token_id, self._text_of(token.token_id), token.logprob, top)

    def _text_of(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id])
            self._token_text[token_id] = text
        return text

    def _close(self, state: RequestState) -> RequestOutput:
        output = state.take_output()
        del self._requests[state.request_id]
        self.scheduler.forget(state.request_id)
        self._finished_requests[state.seqs[0].finish_reason or "abort"] += 1
        return output

    # -- stats ------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        """A snapshot of gauges and counters for /metrics."""
        counters = self.kv_cache.counters
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_cache_usage=self.kv_cache.pool.usage,
            num_blocks=self.budget.num_blocks,
            block_size=self.config.block_size,
            prefix_cache_queries=counters.queries,
            prefix_cache_hits=counters.hits,
            num_preemptions=self.scheduler.num_preemptions,
            prompt_tokens=self._prompt_tokens,
            generation_tokens=self._generation_tokens,
            num_steps=self._num_steps,
            finished_requests=dict(self._finished_requests),
        )
