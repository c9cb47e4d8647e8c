"""What the KV budget buys: blocks, tokens, concurrency at max_model_len, logged at start."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from inhouse.engine.config import MAX_DEFAULT_MODEL_LEN, EngineConfig, default_kv_cache_memory
from inhouse.engine.errors import EngineConfigError
from inhouse.plan.capacity import kv_bytes_per_token as plan_kv_bytes_per_token
from inhouse.plan.capacity import kv_cache_capacity
from inhouse.plan.spec import spec_from_hf_config

if TYPE_CHECKING:
    from inhouse.engine.models.loader import LoadedModel

log = logging.getLogger(__name__)

# The planner's name for each cache dtype the engine allocates.
PLAN_KV_DTYPES = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.int8: "int8",
}


@dataclass(slots=True, frozen=True)
class KVBudget:
    """The KV cache the engine allocates and the max_model_len it can always serve."""

    kv_cache_memory: int
    kv_bytes_per_token: int
    num_blocks: int
    block_size: int
    max_model_len: int
    reason: str
    adapter_bytes: int = 0  # LoRA adapter slots, taken out of a default budget

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def max_concurrency(self) -> float:
        return self.num_blocks / -(-self.max_model_len // self.block_size)


def kv_bytes_per_token(loaded: LoadedModel) -> int:
    """K and V of every layer for one token in the model's KV dtype, as ``inhouse.plan``
    counts them, and an int8 row's scale beside its codes."""
    spec = spec_from_hf_config(loaded.config_dict)
    planned = plan_kv_bytes_per_token(spec, PLAN_KV_DTYPES[loaded.kv_dtype])
    if loaded.kv_dtype != torch.int8:
        return planned
    return planned * loaded.kv_row_width // spec.head_dim


def plan_kv_budget(config: EngineConfig, loaded: LoadedModel, adapter_bytes: int = 0) -> KVBudget:
    """Size the KV cache from the config; lower a defaulted max_model_len to what fits. A
    default budget (a share of free memory) also holds the adapter slots' ``adapter_bytes``;
    ``--kv-cache-memory`` is the KV cache's alone."""
    model_max = int(
        getattr(loaded.hf_config, "max_position_embeddings", None) or MAX_DEFAULT_MODEL_LEN
    )
    if config.max_model_len is not None and config.max_model_len > model_max:
        raise EngineConfigError(
            f"max_model_len {config.max_model_len} exceeds the model's "
            f"max_position_embeddings {model_max}"
        )
    max_model_len = config.max_model_len or min(model_max, MAX_DEFAULT_MODEL_LEN)
    per_token = kv_bytes_per_token(loaded)
    block_size = config.block_size
    one_sequence = -(-max_model_len // block_size) * block_size * per_token
    if config.kv_cache_memory is not None:
        memory, reason = config.kv_cache_memory, "--kv-cache-memory"
    else:
        memory, reason = default_kv_cache_memory(config.device, one_sequence)
        if adapter_bytes:
            memory -= adapter_bytes
            reason += f", less {adapter_bytes / 2**20:.1f} MiB of LoRA adapter slots"
    num_blocks = kv_cache_capacity(memory, per_token, block_size, max_model_len).num_blocks
    if num_blocks * block_size < max_model_len:
        fits = num_blocks * block_size
        message = (
            f"the KV cache budget of {memory} bytes holds {fits} tokens "
            f"({num_blocks} blocks of {block_size}), fewer than max_model_len {max_model_len}"
        )
        if config.max_model_len is not None or fits < 2:
            raise EngineConfigError(message + "; raise kv_cache_memory or lower max_model_len")
        log.warning("%s; lowering max_model_len to %d", message, fits)
        max_model_len = fits
    budget = KVBudget(
        memory, per_token, num_blocks, block_size, max_model_len, reason, adapter_bytes
    )
    log.info(
        "KV cache: %d blocks of %d tokens = %d tokens (%.1f MiB: %s); "
        "maximum concurrency for %d tokens per request: %.2fx",
        budget.num_blocks,
        block_size,
        budget.num_tokens,
        memory / 2**20,
        reason,
        max_model_len,
        budget.max_concurrency,
    )
    return budget
