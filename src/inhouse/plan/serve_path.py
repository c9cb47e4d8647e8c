"""Which dtype and weight format `inhouse serve` runs a model in on a host, and why.

The one decision, torch-free: the engine takes it at load (``engine.models.precision``
gathers the host's facts), and `inhouse plan --cpu` takes it for the host it plans for, so
the plan recommends exactly the path serve would choose and never a flag that slows it.

On a CPU a decode step streams every weight once, so the bytes per weight decide its
speed. The default is int8 block weights (q8, 1.125 bytes a weight) on the C++ kernels
wherever they build, AMX CPUs included; a GGUF whose projections are Q4_1 runs them as q4
(0.75 bytes a weight, the file's own blocks). Without the kernels: bf16 where the CPU has
it natively, else fbgemm's float16 weights with float32 activations. An explicit
``--dtype`` keeps the checkpoint's exact weights in that dtype: bf16 on an AMX CPU runs on
the C++ kernels' bf16 tiles, on an AVX-512 BF16 one (Zen 4) on their ``vdpbf16ps`` chains,
~2x slower a token at one stream than the default q8 (it streams 2 bytes a weight, not
1.125); elsewhere in torch matmuls in batch-invariant row blocks, ~6x slower
(docs/benchmarks.md, "The plan's serve command"). The start-up table's "why" line says
which. On CUDA weights stay in the (bf16/fp16) dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

QUANTIZATIONS = ("auto", "none", "fp16", "q8", "q4")
DTYPES = ("float32", "bfloat16", "float16")
DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
# One stream's decode, explicit --dtype bfloat16 against the default q8, bf16 safetensors of
# the bundled model: torch's bf16 matmuls in row blocks (the kernels without a bf16 unit; a
# 2-core AMX Xeon), and the kernels' bf16 unit, AMX tiles or vdpbf16ps (both stream 2 bytes
# a weight: docs/benchmarks.md, "The plan's serve command" and "The explicit bf16 path").
EXPLICIT_BF16_SLOWDOWN = 6
EXPLICIT_BF16_KERNELS_SLOWDOWN = 2


@dataclass(frozen=True, slots=True)
class Host:
    """What the choice needs to know of the machine it runs on."""

    device: str = "cpu"  # a torch device type: "cpu" or "cuda"
    kernels_isa: str | None = None  # the ISA the C++ CPU kernels built for; None: not built
    native_bf16: bool = False  # CPU: avx512_bf16 or amx_bf16; CUDA: bf16 supported
    fbgemm: bool = False  # torch's fbgemm engine (x86): float16 weights


@dataclass(frozen=True, slots=True)
class ServePath:
    """Activations/KV dtype name, weight format, and one line saying why."""

    dtype: str  # float32, bfloat16 or float16
    quantization: str  # none, fp16, q8 or q4
    reason: str


def resolve_dtype(name: str, host: Host) -> str:
    """ "auto" -> bf16 on CUDA with bf16 or a CPU with native bf16, float16 on other CUDA,
    float32 on other CPUs; an explicit name (or alias) as it is."""
    name = DTYPE_ALIASES.get(name, name)
    if name in DTYPES:
        return name
    if name != "auto":
        raise ValueError(f"unknown dtype {name!r}; use auto, float32, bfloat16 or float16")
    if host.device == "cuda":
        return "bfloat16" if host.native_bf16 else "float16"
    return "bfloat16" if host.native_bf16 else "float32"


def choose_path(
    dtype_name: str, quantization: str, host: Host, source_blocks: str | None = None
) -> ServePath:
    """The path for ``--dtype dtype_name --quantization quantization`` on ``host``.

    "auto" weights on a CPU with dtype auto: where the C++ kernels are built, q4 for a GGUF
    whose projections are Q4_1 (``source_blocks``: q4 holds those very blocks) and q8 for
    anything else; without the kernels bf16 where the CPU has it natively, else fp16
    (fbgemm), else float32. An explicit weight format on a CPU with dtype auto runs float32
    activations. An explicit dtype with "auto" weights keeps the dtype's exact weights.
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}; use {', '.join(QUANTIZATIONS)}")
    dtype_auto = DTYPE_ALIASES.get(dtype_name, dtype_name) == "auto"
    dtype = resolve_dtype(dtype_name, host)
    if host.device != "cpu":
        if quantization not in ("auto", "none"):
            raise ValueError(f"quantization {quantization} runs on CPU only, not {host.device}")
        return ServePath(dtype, "none", f"{host.device}: weights in {dtype}")
    if quantization == "auto" and not dtype_auto:
        return ServePath(dtype, "none", _explicit_dtype_reason(dtype, host, source_blocks))
    if quantization == "auto" and host.kernels_isa is not None:
        if source_blocks == "Q4_1":
            why = f"the GGUF's own Q4_1 blocks on C++ kernels for {host.kernels_isa}"
            return ServePath("float32", "q4", f"{why}: 0.75 bytes a weight")
        why = f"int8 blocks on C++ kernels for {host.kernels_isa}: 1.125 bytes a weight"
        return ServePath("float32", "q8", why)
    if quantization == "none" or (quantization == "auto" and dtype == "bfloat16"):
        why = "bf16 native on this CPU" if dtype == "bfloat16" and dtype_auto else "asked"
        return ServePath(dtype, "none", f"weights in {dtype} ({why})")
    if not dtype_auto and dtype != "float32":
        raise ValueError(
            f"quantization {quantization} computes in float32 activations; "
            f"drop --dtype {dtype} or use --quantization none"
        )
    if quantization in ("q8", "q4"):
        if host.kernels_isa is None:
            raise ValueError(
                f"quantization {quantization} needs the C++ CPU kernels, which could not be "
                "built here (no C++ compiler?); use fp16 or none"
            )
        return ServePath("float32", quantization, f"asked: C++ kernels for {host.kernels_isa}")
    if host.fbgemm:
        why = "asked" if quantization == "fp16" else "fbgemm fp16: half the bytes of float32"
        return ServePath("float32", "fp16", why)
    if quantization == "fp16":
        raise ValueError("quantization fp16 needs fbgemm (an x86 CPU)")
    return ServePath(dtype, "none", "no fbgemm on this CPU: float32 weights")


def _bf16_unit(host: Host) -> str | None:
    """Where the C++ kernels multiply bf16 weights on ``host`` (``bf16_linear.cpp``): AMX
    tiles, AVX-512 BF16's ``vdpbf16ps``, or nowhere (torch's matmuls in row blocks)."""
    if host.kernels_isa == "avx512-amx":
        return "AMX bf16 tiles"
    if host.kernels_isa == "avx512-vnni" and host.native_bf16:
        return "AVX-512 BF16 (vdpbf16ps)"
    return None


def _explicit_dtype_reason(dtype: str, host: Host, source_blocks: str | None) -> str:
    """Why an explicit --dtype runs as it does, and, where the kernels would have run the
    default, what it costs."""
    why = f"--dtype {dtype} asked: the checkpoint's exact weights in torch {dtype} matmuls"
    if host.kernels_isa is None:
        return why
    default = choose_path("auto", "auto", host, source_blocks).quantization
    unit = _bf16_unit(host)
    if dtype == "bfloat16" and unit is not None:
        why = f"--dtype {dtype} asked: the checkpoint's exact weights on the kernels' {unit}"
        why += ", one order at any row count"
        cost = f"~{EXPLICIT_BF16_KERNELS_SLOWDOWN}x slower a token at one stream than"
    elif dtype == "bfloat16":
        why += " (batch-invariant row blocks)"
        cost = f"~{EXPLICIT_BF16_SLOWDOWN}x slower a token at one stream than"
    else:
        cost = "slower than"
    return (
        f"{why}; {cost} the default ({default} weights on C++ kernels for "
        f"{host.kernels_isa}): drop --dtype for speed"
    )
