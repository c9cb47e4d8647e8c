"""EngineConfig: the engine's flags, and the default KV budget taken from free memory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from inhouse.engine.errors import EngineConfigError

MAX_DEFAULT_MODEL_LEN = 8192
QUANTIZATIONS = ("auto", "none", "fp16", "q8", "q4")
# Share of available memory the KV cache takes when no budget is given.
DEFAULT_KV_FRACTION_CPU = 0.1
DEFAULT_KV_FRACTION_CUDA = 0.8
# The default CPU budget stays small so the whole engine fits in 1 GB with the bundled model.
DEFAULT_KV_CAP_CPU = 192 * 2**20
MAX_KV_FRACTION_CPU = 0.25


@dataclass(slots=True)
class EngineConfig:
    """What to load and how to batch it.

    ``model`` None loads the bundled SmolLM2. ``quantization`` is the weight format:
    "auto", "none", "fp16", "q8" or "q4" (see ``models.precision.choose_precision``).
    ``max_model_len`` None takes min(the model's max_position_embeddings, 8192).
    ``kv_cache_memory`` None takes a share of free memory (see ``default_kv_cache_memory``).
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

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise EngineConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.quantization not in QUANTIZATIONS:
            raise EngineConfigError(
                f"unknown quantization {self.quantization!r}; use {', '.join(QUANTIZATIONS)}"
            )
        if self.max_model_len is not None and self.max_model_len < 2:
            raise EngineConfigError(f"max_model_len must be at least 2, got {self.max_model_len}")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise EngineConfigError(
                f"kv_cache_memory must be a positive number of bytes, got {self.kv_cache_memory}"
            )


def default_kv_cache_memory(device: str, one_sequence_bytes: int = 0) -> int:
    """Bytes for the KV cache when none are given: a share of what the device has free.

    On CPU the share is capped (pages of the cache only become resident when used) but
    raised to hold one ``max_model_len`` sequence when that costs at most a quarter of
    the available memory, so the default never has to shorten ``max_model_len``.
    """
    if device.startswith("cuda"):
        import torch

        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return int(free * DEFAULT_KV_FRACTION_CUDA)
    available = _mem_available()
    share = min(int(available * DEFAULT_KV_FRACTION_CPU), DEFAULT_KV_CAP_CPU)
    if share < one_sequence_bytes <= available * MAX_KV_FRACTION_CPU:
        return one_sequence_bytes
    return share


def _mem_available(meminfo: Path = Path("/proc/meminfo")) -> int:
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise EngineConfigError(f"no MemAvailable in {meminfo}; pass kv_cache_memory explicitly")
