"""EngineConfig: the engine's flags, and the default KV budget taken from free memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from inhouse.engine.errors import EngineConfigError
from inhouse.engine.speculative.config import SpeculativeConfig
from inhouse.plan.adapters import DEFAULT_MAX_LORA_RANK, default_max_loras
from inhouse.plan.serve_path import QUANTIZATIONS
from inhouse.scheduling.policy import (
    DEFAULT_BACKGROUND_DECODE_ROWS,
    DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD,
    POLICIES,
)

MAX_DEFAULT_MODEL_LEN = 8192
KV_CACHE_DTYPES = ("auto", "int8")
# Share of available memory the KV cache takes when no budget is given.
DEFAULT_KV_FRACTION_CPU = 0.25
DEFAULT_KV_FRACTION_CUDA = 0.8
# vLLM's CPU backend reserves 4 GiB for the KV cache by default (VLLM_CPU_KVCACHE_SPACE).
DEFAULT_KV_CAP_CPU = 4 * 2**30


@dataclass(slots=True)
class EngineConfig:
    """What to load and how to batch it.

    ``model`` None loads the bundled SmolLM2. ``quantization`` is the weight format:
    "auto", "none", "fp16", "q8" or "q4" (see ``models.precision.choose_precision``).
    ``max_model_len`` None takes min(the model's max_position_embeddings, 8192).
    ``kv_cache_memory`` None takes a share of free memory (see ``default_kv_cache_memory``).
    ``kv_reserve`` is the share of the blocks running sequences still need to reach their
    length limit that admission keeps free (1: admitted work always finishes without
    preemption; 0: admit whenever the prompt fits and let preemption sort it out).
    ``speculative`` turns on speculative decoding (see ``speculative.config``).
    ``scheduling_policy`` is "fcfs" (arrival order), "priority" (by request priority, then
    arrival) or "fair" (priority, then fair share between tenants; see ``inhouse.scheduling``).
    ``long_prefill_token_threshold`` caps a step's prefill tokens under priority and fair
    while more than one sequence wants tokens (None: the default; 0: no cap).
    ``background_decode_rows`` caps, under priority and fair, a step's decodes of worse
    priority while better-priority work is active (None: the default; 0: no cap).
    ``kv_cache_dtype`` is "auto" (the path's own: float16 under q8/q4, else the activations')
    or "int8" (a scale per token and KV head, on the q8/q4 kernels' path).
    ``lora_modules`` are PEFT LoRA adapters loaded at start, by the name requests give;
    ``max_loras`` slots (None: as many as there are modules, at least ``DEFAULT_MAX_LORAS``
    once there is one; 0: none, and none can be loaded later) of rank up to
    ``max_lora_rank`` hold them, counted in the default KV budget.
    """

    model: str | Path | None = None
    dtype: str = "auto"
    quantization: str = "auto"
    device: str = "cpu"
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    kv_cache_memory: int | None = None
    enable_prefix_caching: bool = True
    seed: int | None = None
    kv_reserve: float = 1.0
    speculative: SpeculativeConfig | None = None
    scheduling_policy: str = "fcfs"
    long_prefill_token_threshold: int | None = None
    background_decode_rows: int | None = None
    kv_cache_dtype: str = "auto"
    lora_modules: dict[str, str] = field(default_factory=dict)
    max_loras: int | None = None
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise EngineConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.scheduling_policy not in POLICIES:
            raise EngineConfigError(
                f"unknown scheduling policy {self.scheduling_policy!r}; use " + ", ".join(POLICIES)
            )
        for name in ("long_prefill_token_threshold", "background_decode_rows"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise EngineConfigError(f"{name} must be at least 0, got {value}")
        if self.quantization not in QUANTIZATIONS:
            raise EngineConfigError(
                f"unknown quantization {self.quantization!r}; use {', '.join(QUANTIZATIONS)}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise EngineConfigError(
                f"unknown kv_cache_dtype {self.kv_cache_dtype!r}; use {', '.join(KV_CACHE_DTYPES)}"
            )
        if self.max_lora_rank < 1:
            raise EngineConfigError(f"max_lora_rank must be at least 1, got {self.max_lora_rank}")
        if self.max_loras is not None and self.max_loras < len(self.lora_modules):
            raise EngineConfigError(
                f"max_loras {self.max_loras} is fewer than the {len(self.lora_modules)} "
                "--lora-modules given"
            )
        if self.max_model_len is not None and self.max_model_len < 2:
            raise EngineConfigError(f"max_model_len must be at least 2, got {self.max_model_len}")
        if not 0 <= self.kv_reserve <= 1:
            raise EngineConfigError(f"kv_reserve must be in [0, 1], got {self.kv_reserve}")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise EngineConfigError(
                f"kv_cache_memory must be a positive number of bytes, got {self.kv_cache_memory}"
            )


def adapter_slots(config: EngineConfig) -> int:
    """How many adapter slots the engine holds (see ``EngineConfig``)."""
    return default_max_loras(len(config.lora_modules), config.max_loras)


def prefill_cap(config: EngineConfig) -> int:
    """Prefill tokens a shared step gives: the threshold, its default, or (0, or fcfs) the
    whole step budget."""
    threshold = config.long_prefill_token_threshold
    if threshold is None:
        threshold = DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD
    if config.scheduling_policy == "fcfs" or threshold == 0:
        return config.max_num_batched_tokens
    return min(threshold, config.max_num_batched_tokens)


def background_decode_rows(config: EngineConfig) -> int:
    """Worse-priority decodes a step runs while better work is active (0: no cap)."""
    if config.scheduling_policy == "fcfs":
        return 0
    rows = config.background_decode_rows
    return DEFAULT_BACKGROUND_DECODE_ROWS if rows is None else rows


def describe_scheduling(config: EngineConfig) -> str:
    """The start-up table's line: the policy, and the caps where they apply."""
    if config.scheduling_policy == "fcfs":
        return "fcfs"
    rows = background_decode_rows(config)
    background = f", {rows} background decodes" if rows else ""
    return (
        f"{config.scheduling_policy} (prefill cap {prefill_cap(config)} tokens a step{background})"
    )


def default_kv_cache_memory(device: str, one_sequence_bytes: int = 0) -> tuple[int, str]:
    """Bytes for the KV cache when none are given, and why that many.

    CUDA: 80% of free device memory. CPU: a quarter of available memory, at most 4 GiB
    (vLLM's CPU default), raised to one ``max_model_len`` sequence when that still fits
    in the quarter. CPU pages become resident only once a block is written.
    """
    if device.startswith("cuda"):
        # torch: only a CUDA device needs it; the config imports without it (serve's CLI).
        import torch

        free, _total = torch.cuda.mem_get_info(torch.device(device))
        share = int(free * DEFAULT_KV_FRACTION_CUDA)
        return share, f"{DEFAULT_KV_FRACTION_CUDA:.0%} of {_gib(free)} free on {device}"
    available = _mem_available()
    quarter = int(available * DEFAULT_KV_FRACTION_CPU)
    why = f"a quarter of {_gib(available)} available memory"
    if quarter <= DEFAULT_KV_CAP_CPU:
        return quarter, why
    if one_sequence_bytes > DEFAULT_KV_CAP_CPU:
        return min(one_sequence_bytes, quarter), why + ", held to one max-model-len sequence"
    return DEFAULT_KV_CAP_CPU, why + f", capped at {_gib(DEFAULT_KV_CAP_CPU)} (vLLM's CPU default)"


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.1f} GiB"


def _mem_available(meminfo: Path = Path("/proc/meminfo")) -> int:
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise EngineConfigError(f"no MemAvailable in {meminfo}; pass kv_cache_memory explicitly")
