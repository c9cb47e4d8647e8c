"""Put the arithmetic together: one Plan per (model, GPU, options), every number in it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from inhouse.plan import capacity
from inhouse.plan.adapters import (
    DEFAULT_MAX_LORA_RANK,
    AdapterMemory,
    adapter_memory,
    default_max_loras,
)
from inhouse.plan.capacity import KVCacheCapacity, Roofline
from inhouse.plan.errors import PlanError
from inhouse.plan.formats import kv_dtype_bytes, weight_format
from inhouse.plan.gpus import GpuSpec, find_gpu
from inhouse.plan.source import ModelSource
from inhouse.plan.units import binary
from inhouse.plan.vision import DEFAULT_IMAGE_SIZE, VisionMemory, vision_memory
from inhouse.plan.weights import WeightBytes, gguf_weight_bytes, weight_bytes

DEFAULT_GPU = "RTX 4090"  # the 24 GB card of seed 000's worked example
DEFAULT_AVG_CONTEXT = 4000  # seed 000: "4,000 tokens (measure yours)"
MAX_NUM_SEQS_SHARE = 0.8  # seed 004: max-num-seqs ≈ 80% of the computed concurrency
BATCHED_TOKENS_CAP = 8192  # seed 004: 4096–8192 for chat; larger favours throughput over TTFT
TABLE_CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


@dataclass(frozen=True, slots=True)
class PlanInputs:
    """What the user chose; None means "pick the documented default"."""

    gpu: str | None = None
    vram_bytes: int | None = None  # per GPU; overrides the GPU's memory
    tp: int = 1
    util: float = 0.9
    overhead_bytes: int | None = None  # per GPU
    avg_context: int | None = None
    max_model_len: int | None = None
    weights: str | None = None  # a format name; None keeps the checkpoint's own
    kv_dtype: str = "auto"  # auto: the activation dtype, as vLLM's --kv-cache-dtype auto
    block_size: int = capacity.DEFAULT_BLOCK_SIZE
    cpu_cores: int | None = None  # a CPU host's cores (vram_bytes is then its RAM); None: GPUs
    lora_modules: tuple[tuple[str, str], ...] = ()  # LoRA adapters (name, path) loaded at start
    max_loras: int | None = None  # adapter slots; None: max(modules, 4) with any module, else 0
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK
    images_per_prompt: int | None = None  # None: 4 for a vision-language model, else 0
    image_size: tuple[int, int] = DEFAULT_IMAGE_SIZE  # width, height as clients send them

    @property
    def lora_slots(self) -> int:
        """The adapter slots an engine holds, as serve counts them."""
        return default_max_loras(len(self.lora_modules), self.max_loras)

    @property
    def cpu(self) -> bool:
        """A CPU host: engines run their CPU path."""
        return self.cpu_cores is not None


@dataclass(frozen=True, slots=True)
class ContextRow:
    """One row of the context × concurrency table."""

    context: int
    kv_bytes_per_sequence: int
    sequences: int
    sequences_fp8_kv: int | None  # the same with an 8-bit KV cache, when ours is 16-bit


@dataclass(frozen=True, slots=True)
class Plan:
    """Every number the report, the JSON and the flags show. Memory figures are per GPU."""

    model: ModelSource
    gpu: GpuSpec | None
    inputs: PlanInputs
    vram_bytes: int
    overhead_bytes: int
    overhead_is_default: bool
    avg_context: int
    max_model_len: int
    weights: WeightBytes  # all GPUs together
    weights_per_gpu: int
    adapters: AdapterMemory  # LoRA slots, taken from the KV budget (0 slots: none)
    vision: VisionMemory  # the image encoder and its activations (none: a text model)
    kv_budget: int
    kv_bytes_per_token: int
    kv_bytes_per_sequence: int
    max_concurrent: int
    largest_context: int
    kv_cache: KVCacheCapacity
    table: tuple[ContextRow, ...]
    roofline: Roofline | None
    fits: bool
    reason: str

    @property
    def max_num_seqs(self) -> int:
        """Recommended --max-num-seqs: 80% of what fits, at least 1."""
        return max(1, int(self.max_concurrent * MAX_NUM_SEQS_SHARE))

    @property
    def max_num_batched_tokens(self) -> int:
        """Recommended --max-num-batched-tokens: the context cap, at most 8192."""
        return min(BATCHED_TOKENS_CAP, self.max_model_len)


def _weights(model: ModelSource, chosen: str | None) -> WeightBytes:
    if chosen is None and model.gguf_tensors is not None:
        return gguf_weight_bytes(model.gguf_tensors)
    return weight_bytes(model.spec, weight_format(chosen or model.weights_format))


def _check(inputs: PlanInputs) -> None:
    if not 0 < inputs.util <= 1:
        raise PlanError(f"--util must be in (0, 1], not {inputs.util}")
    for name, value in (
        ("--avg-context", inputs.avg_context),
        ("--max-model-len", inputs.max_model_len),
    ):
        if value is not None and value < 1:
            raise PlanError(f"{name} must be a positive number of tokens, not {value}")
    if inputs.block_size < 1:
        raise PlanError(f"the block size must be positive, not {inputs.block_size}")
    kv_dtype_bytes(inputs.kv_dtype)


def _default_max_model_len(model_max: int, avg_context: int, fits: int) -> int:
    """Twice the average context (at least 8192, as seed 000's example), within what fits."""
    wanted = max(8192, 1 << (2 * avg_context - 1).bit_length())
    longest = fits // 1024 * 1024 if fits >= 1024 else fits
    return max(1, min(model_max, wanted, longest))


def _table(
    model: ModelSource, inputs: PlanInputs, kv_budget: int, model_max: int, avg: int
) -> tuple[ContextRow, ...]:
    contexts = sorted({c for c in TABLE_CONTEXTS if c <= model_max} | {avg})
    what_if_fp8 = kv_dtype_bytes(inputs.kv_dtype) > 1
    rows = []
    for context in contexts:
        per_seq = capacity.kv_bytes_per_sequence(model.spec, context, inputs.kv_dtype, inputs.tp)
        fp8 = capacity.kv_bytes_per_sequence(model.spec, context, "fp8", inputs.tp)
        rows.append(
            ContextRow(
                context=context,
                kv_bytes_per_sequence=per_seq,
                sequences=capacity.max_concurrent_sequences(kv_budget, per_seq),
                sequences_fp8_kv=capacity.max_concurrent_sequences(kv_budget, fp8)
                if what_if_fp8
                else None,
            )
        )
    return tuple(rows)


def _verdict(
    *,
    kv_budget: int,
    usable: int,
    weights: int,
    overhead: int,
    adapters: int,
    images: int,
    concurrent: int,
    longest: int,
    avg: int,
    max_model_len: int,
) -> str:
    """Why the model does not fit, or "" when it does."""
    if kv_budget <= 0:
        slots = f", adapter slots ({binary(adapters)})" if adapters else ""
        slots += f", the image encoder ({binary(images)})" if images else ""
        return (
            f"the weights ({binary(weights)} per GPU){slots} and overhead ({binary(overhead)}) "
            f"exceed the {binary(usable)} usable per GPU; use quantized --weights, more GPUs "
            "with --tp, or a bigger GPU"
        )
    if concurrent < 1:
        return (
            f"the {binary(kv_budget)} left for KV holds {longest:,} tokens, less than one "
            f"sequence of {avg:,} tokens; lower --avg-context or free memory"
        )
    if max_model_len > longest:
        return (
            f"--max-model-len {max_model_len:,} needs more KV than the {binary(kv_budget)} "
            f"free; at most {longest:,} tokens fit in one sequence"
        )
    return ""


def _kv_dtype(model: ModelSource, inputs: PlanInputs) -> str:
    chosen = inputs.kv_dtype.strip().lower()
    if chosen != "auto":
        return chosen
    name = inputs.weights or model.weights_format
    if name == "gguf":
        return "bf16"
    return "fp16" if weight_format(name).activation_dtype == "float16" else "bf16"


def make_plan(model: ModelSource, inputs: PlanInputs) -> Plan:
    """Compute the plan; a model that does not fit gives fits=False and a reason."""
    inputs = dataclasses.replace(inputs, kv_dtype=_kv_dtype(model, inputs))
    _check(inputs)
    spec = model.spec
    gpu = find_gpu(inputs.gpu or DEFAULT_GPU) if inputs.gpu or not inputs.vram_bytes else None
    vram = inputs.vram_bytes or (gpu.memory_bytes if gpu else 0)
    kv_token = capacity.kv_bytes_per_token(spec, inputs.kv_dtype, inputs.tp)
    weights = _weights(model, inputs.weights)
    weights_per_gpu = -(-weights.total // inputs.tp)
    overhead = inputs.overhead_bytes
    if overhead is None:
        overhead = capacity.default_overhead_bytes(spec.total_params)
    adapters = adapter_memory(spec, inputs.lora_slots, inputs.max_lora_rank, inputs.tp)
    vision = vision_memory(model.vision, inputs.images_per_prompt, inputs.image_size, inputs.tp)
    kv_budget = capacity.kv_budget_bytes(vram, inputs.util, weights_per_gpu, overhead)
    kv_budget -= adapters.total + vision.total
    model_max = spec.max_position_embeddings
    if inputs.max_model_len and inputs.max_model_len > model_max:
        raise PlanError(
            f"--max-model-len {inputs.max_model_len:,} exceeds the {model_max:,} positions "
            f"{spec.name} supports"
        )
    room = (inputs.max_model_len or model_max) - vision.prompt_tokens  # the images' tokens first
    text = inputs.avg_context or max(1, min(DEFAULT_AVG_CONTEXT, room))
    avg = text + vision.prompt_tokens  # a prompt's images are tokens in its sequence too
    if avg > (inputs.max_model_len or model_max):
        limit = (
            f"--max-model-len {inputs.max_model_len:,}"
            if inputs.max_model_len
            else (f"the {model_max:,} positions {spec.name} supports")
        )
        images = f" with its images' {vision.prompt_tokens:,} tokens" if vision.images else ""
        raise PlanError(f"--avg-context {text:,}{images} is longer than {limit}")
    longest = min(capacity.largest_context(spec, kv_budget, inputs.kv_dtype, inputs.tp), model_max)
    max_model_len = inputs.max_model_len or _default_max_model_len(model_max, avg, longest)
    kv_seq = capacity.kv_bytes_per_sequence(spec, avg, inputs.kv_dtype, inputs.tp)
    concurrent = capacity.max_concurrent_sequences(kv_budget, kv_seq)
    reason = _verdict(
        kv_budget=kv_budget,
        usable=int(vram * inputs.util),
        weights=weights_per_gpu,
        overhead=overhead,
        adapters=adapters.total,
        images=vision.total,
        concurrent=concurrent,
        longest=longest,
        avg=avg,
        max_model_len=max_model_len,
    )
    roof = None
    if gpu is not None:
        batch = max(1, int(concurrent * MAX_NUM_SEQS_SHARE))
        roof = capacity.roofline(
            bandwidth_bytes_per_s=gpu.bandwidth_bytes_per_s * inputs.tp,
            tflops=gpu.bf16_tflops * inputs.tp,
            weight_bytes_read=weights.read_per_step(spec),
            weight_bytes_read_at_batch=weights.read_per_step(spec, batch),
            kv_bytes_read=kv_seq * inputs.tp,
            active_params=spec.active_params,
            batch=batch,
        )
    return Plan(
        model=model,
        gpu=gpu,
        inputs=inputs,
        vram_bytes=vram,
        overhead_bytes=overhead,
        overhead_is_default=inputs.overhead_bytes is None,
        avg_context=avg,
        max_model_len=max_model_len,
        weights=weights,
        weights_per_gpu=weights_per_gpu,
        adapters=adapters,
        vision=vision,
        kv_budget=kv_budget,
        kv_bytes_per_token=kv_token,
        kv_bytes_per_sequence=kv_seq,
        max_concurrent=concurrent,
        largest_context=longest,
        kv_cache=capacity.kv_cache_capacity(
            max(kv_budget, 0), kv_token, inputs.block_size, max_model_len
        ),
        table=_table(model, inputs, kv_budget, model_max, avg),
        roofline=roof,
        fits=not reason,
        reason=reason or f"{concurrent:,} sequences of {avg:,} tokens fit at once",
    )
