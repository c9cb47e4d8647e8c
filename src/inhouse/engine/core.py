"""EngineCore: what the engine thread does, and nothing else: schedule, run the model, sample.

``add`` queues an ``EngineRequest`` (validated first); ``step`` runs one batched
forward, samples, lets ``Scheduler.update`` apply the result, and returns token-id
news per request (``CoreOutput``); text, stop strings and logprob text are the
``OutputProcessor``'s, on the caller's side. A failure that belongs to one request
(its grammar, its seed, its penalties) finishes that request with an error and the
step goes on; only a fault of the step itself (the forward pass) raises.
"""

from __future__ import annotations

import torch

from inhouse.engine.config import (
    EngineConfig,
    adapter_slots,
    background_decode_rows,
    prefill_cap,
)
from inhouse.engine.errors import AdapterError, EngineInputError
from inhouse.engine.info import EngineInfo
from inhouse.engine.kv_budget import plan_kv_budget
from inhouse.engine.kv_cache import KVCacheManager
from inhouse.engine.lora.peft_adapter import AdapterWeights, read_adapter
from inhouse.engine.lora.slots import AdapterSlots, LoadedAdapter, halves_dtype
from inhouse.engine.models.loader import LoadedModel, load_model, with_kv_cache_dtype
from inhouse.engine.outputs import CoreOutput, Finish, SequenceOutput
from inhouse.engine.request import EngineRequest
from inhouse.engine.runner import ModelRunner
from inhouse.engine.sampler import Sampler
from inhouse.engine.sampling_params import SamplingParams
from inhouse.engine.scheduler import Scheduler
from inhouse.engine.sequence import Sequence
from inhouse.engine.speculative.factory import make_drafter
from inhouse.engine.stats import EngineStats
from inhouse.engine.step_interrupt import StepAbandoned, StepInterrupt

MAX_CACHE_SALT_CHARS = 1024


class EngineCore:
    """One model, one KV cache, one scheduler, one sampler; single-threaded."""

    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None) -> None:
        self.config = config
        loaded = loaded or load_model(
            config.model, config.dtype, config.device, quantization=config.quantization
        )
        self.loaded = with_kv_cache_dtype(loaded, config.kv_cache_dtype)
        slots = adapter_slots(config)
        self.adapters = (
            AdapterSlots(
                self.loaded.model,
                slots,
                config.max_lora_rank,
                self.loaded.attention_kernel,
                halves_dtype(self.loaded.quantization, self.loaded.dtype),
            )
            if slots
            else None
        )
        # read (and so refused, with the reason) before anything is allocated for them
        initial = {name: self.read_adapter(path) for name, path in config.lora_modules.items()}
        adapter_bytes = 0 if self.adapters is None else self.adapters.num_bytes
        self.budget = plan_kv_budget(config, self.loaded, adapter_bytes)
        self.info = EngineInfo.describe(self.loaded, self.budget, config.speculative)
        self.runner = ModelRunner(self.loaded, self.budget.num_blocks, config.block_size)
        self.kv_cache = KVCacheManager(
            self.budget.num_blocks,
            config.block_size,
            config.enable_prefix_caching,
            generated_apart=self.runner.prompt_tiles,
        )
        self.scheduler = Scheduler(
            self.kv_cache,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            self.budget.max_model_len,
            self.loaded.eos_token_ids,
            config.kv_reserve,
            config.scheduling_policy,
            prefill_cap(config),
            background_decode_rows(config),
        )
        self.sampler = Sampler(config.seed)
        self.drafter = make_drafter(config.speculative, self.loaded, config, self.budget.num_blocks)
        # A better request arriving stops a step of worse work (priority and fair only).
        self.interrupt = StepInterrupt() if config.scheduling_policy != "fcfs" else None
        self._abandoned_steps = 0
        self._abandoned_tokens = 0
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._num_steps = 0
        for name, weights in initial.items():
            self.load_adapter(name, weights)

    # -- requests ---------------------------------------------------------------------

    def validate(self, request: EngineRequest) -> None:
        """Raise EngineInputError for a request the engine cannot serve; touches nothing."""
        params = request.params
        if not isinstance(params, SamplingParams):
            raise EngineInputError("params must be SamplingParams", param="params")
        max_model_len = self.info.max_model_len
        num_prompt = len(request.prompt_token_ids)
        if num_prompt == 0:
            raise EngineInputError("the prompt is empty; it needs at least one token", "prompt")
        if num_prompt >= max_model_len:
            raise EngineInputError(
                f"the prompt has {num_prompt} tokens, but max_model_len is "
                f"{max_model_len} and at least one token must be left for the output",
                "prompt",
            )
        if params.max_tokens is not None and num_prompt + params.max_tokens > max_model_len:
            raise EngineInputError(
                f"the prompt ({num_prompt} tokens) plus max_tokens ({params.max_tokens}) is "
                f"{num_prompt + params.max_tokens} tokens, more than max_model_len "
                f"{max_model_len}",
                "max_tokens",
            )
        vocab = self.info.vocab_size
        for param, ids in (
            ("prompt", request.prompt_token_ids),
            ("stop_token_ids", params.stop_token_ids),
        ):
            if not all(isinstance(t, int) and 0 <= t < vocab for t in ids):
                raise EngineInputError(f"{param} token ids must be integers in [0, {vocab})", param)
        if type(request.priority) is not int:
            raise EngineInputError("priority must be an integer", "priority")
        salt = request.cache_salt
        if salt is not None and not 1 <= len(salt) <= MAX_CACHE_SALT_CHARS:
            raise EngineInputError(
                f"cache_salt must have 1 to {MAX_CACHE_SALT_CHARS} characters", "cache_salt"
            )
        if request.adapter is not None:
            self._adapter(request.adapter)
        self._check_images(request)

    def _check_images(self, request: EngineRequest) -> None:
        """A prompt's image tokens are exactly its images' rows: a text prompt that writes
        the image token itself would run that token's bare embedding as if it were an image."""
        side = self.loaded.images
        if side is None:
            if request.images:
                raise EngineInputError(f"model {self.info.model_id!r} reads no images", "prompt")
            return
        held = request.prompt_token_ids.count(side.image_token_id)
        wanted = sum(image.num_tokens for image in request.images)
        if held != wanted:
            raise EngineInputError(
                f"the prompt holds the image token {side.image_token!r} {held} times where its "
                f"{len(request.images)} images take {wanted}: images come as chat image_url "
                "parts, and text must not contain the token",
                "prompt",
            )

    def add(self, request: EngineRequest) -> None:
        """Validate and queue a request (``params.n`` sibling sequences)."""
        self.validate(request)
        self.enqueue(request)

    def enqueue(self, request: EngineRequest) -> None:
        """Queue a request that :meth:`validate` passed (``AsyncEngine`` validates it on the
        caller's side, then queues it here on the engine thread)."""
        if self.scheduler.sequences(request.request_id):
            raise EngineInputError(f"request id {request.request_id!r} is already running")
        params = request.params
        adapter = None if request.adapter is None else self._adapter(request.adapter)
        seqs = [
            Sequence(
                request_id=request.request_id,
                token_ids=list(request.prompt_token_ids),
                sampling_params=params,
                index=i,
                cache_salt=request.cache_salt,
                priority=request.priority,
                adapter=adapter,
                images=request.images,
                arrival_time=request.arrival_time,
                guide=params.guide_factory() if params.guide_factory else None,
            )
            for i in range(params.n)
        ]
        self.scheduler.add(seqs)
        self._prompt_tokens += len(request.prompt_token_ids)

    # -- adapters ---------------------------------------------------------------------

    def read_adapter(self, path: str) -> AdapterWeights:
        """A PEFT adapter checked against this base and ``--max-lora-rank`` (any thread);
        AdapterError if it cannot be served here."""
        if self.adapters is None:
            raise AdapterError("this engine holds no adapter slots (started with --max-loras 0)")
        return read_adapter(path, self.loaded.model.args, self.adapters.max_rank)

    def load_adapter(self, name: str, weights: AdapterWeights) -> LoadedAdapter:
        """Put an adapter read by :meth:`read_adapter` in a free slot (engine thread)."""
        assert self.adapters is not None
        return self.adapters.install(name, weights, self._slot_in_use)

    def unload_adapter(self, name: str) -> LoadedAdapter:
        """Stop taking requests for ``name`` (engine thread); its running ones finish.
        KeyError if no adapter has that name."""
        if self.adapters is None:
            raise KeyError(name)
        return self.adapters.remove(name)

    def _adapter(self, name: str) -> LoadedAdapter:
        adapter = None if self.adapters is None else self.adapters.adapters.get(name)
        if adapter is None:
            raise EngineInputError(f"no LoRA adapter named {name!r} is loaded", "model")
        return adapter

    def _slot_in_use(self, slot: int) -> bool:
        live = (*self.scheduler.running, *self.scheduler.waiting)
        return any(seq.adapter is not None and seq.adapter.slot == slot for seq in live)

    def abort(self, request_id: str, reason: str = "abort") -> CoreOutput | None:
        """Stop a request now and free its blocks; its news (None if it was not running)."""
        seqs = self.scheduler.finish_request(request_id, reason)
        if not seqs:
            return None
        if self.drafter is not None:
            self.drafter.keep_only(self.scheduler.running)
        return CoreOutput(request_id, [SequenceOutput(s.index, finish_reason=reason) for s in seqs])

    def finish(self, request_id: str, index: int, reason: str, stop_reason: str | None) -> None:
        """Finish one sequence the output processor stopped (a stop string), if still running."""
        for seq in self.scheduler.sequences(request_id):
            if seq.index == index:
                self.scheduler.finish(seq, reason, stop_reason)
        if self.drafter is not None:
            self.drafter.keep_only(self.scheduler.running)

    def apply_finish(self, finish: Finish) -> None:
        """Finish what the output processor ended: one sequence (a stop string), or the
        whole request (it failed there)."""
        if finish.index is None:
            self.abort(finish.request_id, finish.reason)
        else:
            self.finish(finish.request_id, finish.index, finish.reason, finish.stop_reason)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the step ---------------------------------------------------------------------

    def step(self) -> list[CoreOutput]:
        """Run one scheduled batch; return the news of every request that sampled a token.
        The sampler runs with the forward's threads (torch's own ops alone on a q8/q4 step)."""
        with self.runner.threads():
            return self._step()

    def _step(self) -> list[CoreOutput]:
        drafts = {}
        if self.drafter is not None:
            drafts = self.drafter.propose(self.scheduler.decoding(), self._num_steps)
        plan = self.scheduler.schedule(drafts)
        if not plan.scheduled:
            return []
        interrupt = self.interrupt
        if interrupt is not None:
            interrupt.begin(min(seq.priority for seq, _ in plan.scheduled))
        try:
            logits = self.runner.execute(plan.scheduled, plan.drafts, interrupt)
        except StepAbandoned:
            self.scheduler.abandon(plan)
            self._abandoned_steps += 1
            self._abandoned_tokens += plan.num_tokens
            return []
        finally:
            if interrupt is not None:
                interrupt.end()
        eos = self.scheduler.eos_token_ids

        def sample(rows: list[int], seqs: list[Sequence]) -> list:
            return self.sampler(_logit_rows(logits, rows), seqs, eos)

        news, verified = self.scheduler.update(plan, sample)
        if self.drafter is not None:
            self.drafter.record(verified, self._num_steps)
            self.drafter.keep_only(self.scheduler.running)
        self._num_steps += 1
        self._generation_tokens += sum(1 for _, out in news if out.token_id is not None)
        outputs: dict[str, CoreOutput] = {}
        for seq, out in news:
            output = outputs.get(seq.request_id)
            if output is None:
                output = outputs[seq.request_id] = CoreOutput(seq.request_id, [])
            output.seqs.append(out)
            if seq.index == 0:
                output.num_cached_tokens = seq.num_cached_tokens
                output.first_scheduled_time = seq.first_scheduled_time
        return list(outputs.values())

    # -- stats ------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        """A snapshot of gauges and counters for /metrics."""
        counters = self.kv_cache.counters
        images = self.loaded.images
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_cache_usage=self.kv_cache.pool.usage,
            num_blocks=self.budget.num_blocks,
            block_size=self.config.block_size,
            prefix_cache_queries=counters.queries,
            prefix_cache_hits=counters.hits,
            num_preemptions=self.scheduler.num_preemptions,
            preemptions_by_cause=dict(self.scheduler.preemptions),
            prompt_tokens=self._prompt_tokens,
            generation_tokens=self._generation_tokens,
            num_steps=self._num_steps,
            finished_requests=dict(self.scheduler.finished_requests),
            spec_decode=None if self.drafter is None else self.drafter.counters.snapshot(),
            abandoned_steps=self._abandoned_steps,
            abandoned_tokens=self._abandoned_tokens,
            images_encoded=0 if images is None else images.encoded,
            image_encode_seconds=0.0 if images is None else images.encode_seconds,
        )


def _logit_rows(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """The listed rows of the step's logits: a view when they are consecutive (every row of
    a step without drafts, one verification round of one sequence), else a copy."""
    first = rows[0]
    if rows == list(range(first, first + len(rows))):
        return logits[first : first + len(rows)]
    return logits[rows]
