"""The arithmetic: KV bytes per token and per sequence, what a KV budget buys, roofline.

    kv_token       = 2 · layers · kv_heads · head_dim · kv_bytes      (MLA: (rank + rope) · layers)
    max_concurrent = (vram · util − weights − overhead) / (kv_token · avg_context)

The engine calls `kv_cache_capacity` at start, so engine and planner agree by
construction. Pure Python: no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inhouse.plan.errors import PlanError
from inhouse.plan.formats import kv_dtype_bytes
from inhouse.plan.spec import ModelSpec
from inhouse.plan.units import GIB

DEFAULT_BLOCK_SIZE = 16  # tokens per KV block, vLLM's default on GPU


@dataclass(frozen=True, slots=True)
class KVCacheCapacity:
    """What a KV budget buys in fixed-size blocks, as vLLM reports it at start."""

    num_blocks: int
    num_tokens: int
    max_concurrency: float  # sequences of max_model_len tokens that fit at once


def kv_cache_capacity(
    kv_cache_bytes: int, kv_bytes_per_token: int, block_size: int, max_model_len: int
) -> KVCacheCapacity:
    """Blocks, tokens and "Maximum concurrency for max_model_len tokens per request"."""
    if kv_bytes_per_token <= 0 or block_size <= 0 or max_model_len <= 0:
        raise PlanError("KV bytes per token, block size and max model length must be positive")
    num_blocks = max(kv_cache_bytes, 0) // (kv_bytes_per_token * block_size)
    blocks_per_request = math.ceil(max_model_len / block_size)
    return KVCacheCapacity(
        num_blocks=num_blocks,
        num_tokens=num_blocks * block_size,
        max_concurrency=num_blocks / blocks_per_request,
    )


def kv_heads_per_gpu(spec: ModelSpec, tp: int) -> int:
    """K/V heads each GPU caches under tensor parallelism, after vLLM's rule.

    TP must divide the attention heads; it must divide the KV heads too, or be a
    multiple of them, in which case each GPU holds one replicated KV head.
    """
    if tp < 1:
        raise PlanError(f"the tensor-parallel size must be at least 1, not {tp}")
    heads, kv_heads = spec.num_attention_heads, spec.num_key_value_heads
    if heads % tp:
        raise PlanError(
            f"tensor parallel {tp} does not divide the {heads} attention heads of {spec.name}"
        )
    if spec.is_mla:
        return kv_heads
    if kv_heads % tp == 0:
        return kv_heads // tp
    if tp % kv_heads == 0:
        return 1
    raise PlanError(
        f"tensor parallel {tp} does not divide the {kv_heads} KV heads of {spec.name} "
        f"(use a TP size that divides {kv_heads} or is a multiple of it)"
    )


def kv_bytes_per_layer_token(spec: ModelSpec, kv_dtype: str = "bf16", tp: int = 1) -> int:
    """Bytes one layer caches for one token on one GPU.

    MLA caches one latent vector per token that every head shares, so it is not
    split by TP: each GPU holds all of it.
    """
    size = kv_dtype_bytes(kv_dtype)
    heads = kv_heads_per_gpu(spec, tp)
    if spec.is_mla:
        return (spec.kv_lora_rank + spec.qk_rope_head_dim) * size
    return 2 * heads * spec.head_dim * size


def kv_bytes_per_token(spec: ModelSpec, kv_dtype: str = "bf16", tp: int = 1) -> int:
    """Bytes the KV cache holds per token on each GPU, every layer counted (no window cap)."""
    return spec.num_layers * kv_bytes_per_layer_token(spec, kv_dtype, tp)


def kv_bytes_per_sequence(
    spec: ModelSpec, context: int, kv_dtype: str = "bf16", tp: int = 1
) -> int:
    """Bytes one sequence of `context` tokens holds per GPU; sliding layers stop at the window."""
    per_layer = kv_bytes_per_layer_token(spec, kv_dtype, tp)
    sliding = len(spec.sliding_layers)
    window_tokens = min(context, spec.sliding_window) if sliding else 0
    return per_layer * ((spec.num_layers - sliding) * context + sliding * window_tokens)


def kv_budget_bytes(vram_bytes: int, util: float, weight_bytes: int, overhead_bytes: int) -> int:
    """Bytes left for the KV cache on one GPU: vram · util − weights − overhead (may be < 0)."""
    return int(vram_bytes * util) - weight_bytes - overhead_bytes


def max_concurrent_sequences(kv_budget: int, kv_bytes_per_seq: int) -> int:
    """Whole sequences of a given KV size that fit in the budget at once."""
    return max(kv_budget, 0) // kv_bytes_per_seq


def largest_context(spec: ModelSpec, kv_budget: int, kv_dtype: str = "bf16", tp: int = 1) -> int:
    """The longest single sequence whose KV fits in `kv_budget` bytes (model limit ignored)."""
    per_layer = kv_bytes_per_layer_token(spec, kv_dtype, tp)
    full_layers = spec.num_layers - len(spec.sliding_layers)
    window = spec.sliding_window
    if kv_budget <= 0:
        return 0
    if not spec.sliding_layers or kv_budget < per_layer * spec.num_layers * window:
        return kv_budget // (per_layer * spec.num_layers)
    if full_layers == 0:
        return spec.max_position_embeddings  # every layer slides: memory stops growing
    beyond_window = kv_budget - per_layer * spec.num_layers * window
    return window + beyond_window // (per_layer * full_layers)


def default_overhead_bytes(total_params: int) -> int:
    """Memory per GPU that is neither weights nor KV cache, by model size.

    CUDA context and allocator ~0.5–1 GiB, plus peak activations of a prefill
    chunk and CUDA graphs, which grow with the hidden and MLP sizes. Seed 000
    uses ~2 GiB for an 8B model; seed 004 advises 1–2 GB for text models.
    """
    billions = total_params / 1e9
    if billions < 3:
        return 1 * GIB
    if billions < 20:
        return 2 * GIB
    if billions < 100:
        return 3 * GIB
    return 4 * GIB


@dataclass(frozen=True, slots=True)
class Roofline:
    """Upper bounds on decode speed from memory bandwidth and compute."""

    batch1_tokens_per_s: float  # bandwidth / bytes read per token
    batch: int
    batch_tokens_per_s: float  # aggregate at `batch` sequences: min(bandwidth, compute) bound
    bound_at_batch: str  # "memory" or "compute"


def roofline(
    *,
    bandwidth_bytes_per_s: float,
    tflops: float,
    weight_bytes_read: int,
    weight_bytes_read_at_batch: int,
    kv_bytes_read: int,
    active_params: int,
    batch: int,
) -> Roofline:
    """Decode tokens/s bounds: each step streams the weights once plus every sequence's KV.

    `weight_bytes_read_at_batch` is what a step of `batch` sequences reads (more
    than at batch 1 for MoE, whose batch touches more experts).
    """
    single = bandwidth_bytes_per_s / (weight_bytes_read + kv_bytes_read)
    batch = max(batch, 1)
    step_bytes = weight_bytes_read_at_batch + batch * kv_bytes_read
    memory_bound = batch * bandwidth_bytes_per_s / step_bytes
    compute_bound = tflops * 1e12 / (2 * active_params)
    return Roofline(
        batch1_tokens_per_s=single,
        batch=batch,
        batch_tokens_per_s=min(memory_bound, compute_bound),
        bound_at_batch="memory" if memory_bound <= compute_bound else "compute",
    )
