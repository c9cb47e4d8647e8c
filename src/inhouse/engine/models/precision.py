"""Which dtype and weight format a model runs in on this machine, and why.

On a CPU a decode step streams every weight once, so the bytes per weight decide its
speed. The default is int8 block weights (q8, 1.125 bytes a weight) on the C++ kernels
(:mod:`inhouse.engine.kernels`) wherever they build, AMX CPUs included: on a 2-core
Xeon with AMX the bundled model on the kernels (q4) serves 1, 4 and 16 streams 5.3x,
2.9x and 1.05x faster than in bf16 on AMX tiles. A GGUF whose projections are
Q4_1 runs them as q4 (0.75 bytes a weight, the file's own blocks; one stream decodes
~1.2x faster than q8 on an AVX2 host, batches of 16 about as fast). Without the
kernels: bf16 where the CPU has it natively, else fbgemm's float16 weights with float32
activations. q4 (4-bit blocks) runs when asked. ``--dtype`` and ``--quantization``
override the choice, with a clear error for a combination this machine cannot run. On
CUDA weights stay in the (bf16/fp16) dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from inhouse.engine.config import QUANTIZATIONS
from inhouse.engine.kernels.build import Kernels, load_kernels

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
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
    name = _DTYPE_ALIASES.get(name, name)
    if name in _DTYPES:
        return _DTYPES[name]
    if name != "auto":
        raise ValueError(f"unknown dtype {name!r}; use auto, float32, bfloat16 or float16")
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if _cpu_has_bf16() else torch.float32


def _cpu_flags() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _cpu_has_bf16() -> bool:
    flags = _cpu_flags()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def choose_precision(
    dtype_name: str,
    quantization: str,
    device: torch.device,
    kernels: Callable[[], Kernels | None] = load_kernels,
    source_blocks: str | None = None,
) -> Precision:
    """The path for ``--dtype dtype_name --quantization quantization`` on ``device``.

    "auto" weights on a CPU with dtype auto: where the C++ kernels are built, q4 for a GGUF
    whose projections are Q4_1 (``source_blocks``: q4 holds those very blocks) and q8 for
    anything else; without the kernels bf16 where the CPU has it natively, else fp16
    (fbgemm), else float32. An explicit weight format on a CPU with dtype auto runs float32
    activations. An explicit dtype with "auto" weights keeps the dtype's exact weights.
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}; use {', '.join(QUANTIZATIONS)}")
    dtype_auto = _DTYPE_ALIASES.get(dtype_name, dtype_name) == "auto"
    dtype = resolve_dtype(dtype_name, device)
    if device.type != "cpu":
        if quantization not in ("auto", "none"):
            raise ValueError(f"quantization {quantization} runs on CPU only, not {device.type}")
        return Precision(dtype, "none", f"{device.type}: weights in {_name(dtype)}")
    if quantization == "auto" and not dtype_auto:
        return Precision(dtype, "none", f"--dtype {_name(dtype)}: the checkpoint's exact weights")
    if quantization == "auto" and (built := kernels()) is not None:
        if source_blocks == "Q4_1":
            why = f"the GGUF's own Q4_1 blocks on C++ kernels for {built.isa}: 0.75 bytes a weight"
            return Precision(torch.float32, "q4", why)
        why = f"int8 blocks on C++ kernels for {built.isa}: 1.125 bytes a weight"
        return Precision(torch.float32, "q8", why)
    if quantization == "none" or (quantization == "auto" and dtype == torch.bfloat16):
        why = "bf16 native on this CPU" if dtype == torch.bfloat16 and dtype_auto else "asked"
        return Precision(dtype, "none", f"weights in {_name(dtype)} ({why})")
    if not dtype_auto and dtype != torch.float32:
        raise ValueError(
            f"quantization {quantization} computes in float32 activations; "
            f"drop --dtype {_name(dtype)} or use --quantization none"
        )
    if quantization in ("q8", "q4"):
        built = kernels()
        if built is None:
            raise ValueError(
                f"quantization {quantization} needs the C++ CPU kernels, which could not be "
                "built here (no C++ compiler?); use fp16 or none"
            )
        return Precision(torch.float32, quantization, f"asked: C++ kernels for {built.isa}")
    if "fbgemm" in torch.backends.quantized.supported_engines:
        why = "asked" if quantization == "fp16" else "fbgemm fp16: half the bytes of float32"
        return Precision(torch.float32, "fp16", why)
    if quantization == "fp16":
        raise ValueError("quantization fp16 needs fbgemm (an x86 CPU)")
    return Precision(dtype, "none", "no fbgemm on this CPU: float32 weights")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
