"""Which dtype and weight format a model runs in on this machine, and why.

The decision itself is :func:`inhouse.plan.serve_path.choose_path` (torch-free, so `inhouse
plan` takes the same one for the host it plans for); this module gathers this machine's
facts for it (the C++ kernels' ISA, native bf16, fbgemm) and turns its answer into torch
dtypes. ``--dtype`` and ``--quantization`` override the choice, with a clear error for a
combination this machine cannot run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from inhouse.engine.kernels.build import Kernels, build_flags, load_kernels
from inhouse.plan.serve_path import Host, choose_path
from inhouse.plan.serve_path import resolve_dtype as resolve_dtype_name

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WEIGHT_FORMATS = {
    "none": "as the dtype",
    "fp16": "float16, packed for fbgemm",
    "q8": "int8, 32-weight blocks (C++ kernels)",
    "q4": "4-bit, 32-weight blocks (C++ kernels)",
}


@dataclass(frozen=True, slots=True)
class Precision:
    """Activations/KV dtype, weight format, and one line saying why."""

    dtype: torch.dtype
    quantization: str
    reason: str


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """ "auto" -> bf16 on CUDA with bf16 or a CPU with avx512_bf16/amx_bf16, else fp32."""
    return _DTYPES[resolve_dtype_name(name, _host(device, kernels=None))]


def _cpu_has_bf16() -> bool:
    """bf16 in hardware, as far as `INHOUSE_KERNELS_ISA` lets this process see it: `avx2`
    makes an AVX-512 host choose what an AVX2-only host chooses, `avx512-vnni` what a Zen 4
    (bf16 without AMX) does."""
    flags, _ = build_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _host(device: torch.device, kernels: Callable[[], Kernels | None] | None) -> Host:
    """This machine's facts the choice reads; the kernels are loaded (built, the first
    time) only for a CPU, and only when ``kernels`` is given."""
    if device.type == "cuda":
        return Host(device="cuda", native_bf16=torch.cuda.is_bf16_supported())
    built = kernels() if device.type == "cpu" and kernels is not None else None
    return Host(
        device=device.type,
        kernels_isa=built.isa if built is not None else None,
        native_bf16=_cpu_has_bf16(),
        fbgemm="fbgemm" in torch.backends.quantized.supported_engines,
    )


def choose_precision(
    dtype_name: str,
    quantization: str,
    device: torch.device,
    kernels: Callable[[], Kernels | None] = load_kernels,
    source_blocks: str | None = None,
) -> Precision:
    """The path for ``--dtype dtype_name --quantization quantization`` on ``device``: see
    :func:`inhouse.plan.serve_path.choose_path`. ``source_blocks``: a GGUF's main block type."""
    path = choose_path(dtype_name, quantization, _host(device, kernels), source_blocks)
    return Precision(_DTYPES[path.dtype], path.quantization, path.reason)
