"""Weight and KV-cache formats with their real bits per weight.

Quantized checkpoints store more than their nominal bits: AWQ/GPTQ keep a 16-bit
scale and a 4-bit zero point per group of 128 weights (4 + 20/128 = 4.156 bits),
GGUF blocks carry their own scales (Q4_0 is 4.5 bits, not 4). AWQ, GPTQ, fp8 and
int8 quantize only the linear layers; embeddings and lm_head stay 16-bit. GGUF
quantizes the embedding tables too; its K-quant mixes are priced at the file
average llama.cpp reports for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from inhouse.plan.errors import PlanError


@dataclass(frozen=True, slots=True)
class WeightFormat:
    """How one format stores each kind of parameter, in bits per weight."""

    name: str
    linear_bits: float
    embedding_bits: float  # embeddings and lm_head
    other_bits: float  # norms, routers, biases
    note: str
    vllm_quantization: str | None = None  # value of vllm serve --quantization
    activation_dtype: str = "bfloat16"  # value of --dtype


_GROUP_128_INT4 = 4 + (16 + 4) / 128  # 4-bit weight, fp16 scale and 4-bit zero per 128
_GPTQ_G_IDX = 0.01  # GPTQ's int32 group index per input row, ~0.01 bit per weight

WEIGHT_FORMATS: dict[str, WeightFormat] = {
    fmt.name: fmt
    for fmt in (
        WeightFormat("bf16", 16, 16, 16, "16 bits per weight"),
        WeightFormat("fp16", 16, 16, 16, "16 bits per weight", activation_dtype="float16"),
        WeightFormat("fp8", 8, 16, 16, "fp8 linears (scales negligible), 16-bit embeddings", "fp8"),
        WeightFormat("int8", 8, 16, 16, "int8 linears with per-channel scales, 16-bit embeddings"),
        WeightFormat(
            "awq",
            _GROUP_128_INT4,
            16,
            16,
            "4-bit linears + fp16 scale and 4-bit zero per group of 128, 16-bit embeddings",
            "awq",
            "float16",
        ),
        WeightFormat(
            "gptq",
            _GROUP_128_INT4 + _GPTQ_G_IDX,
            16,
            16,
            "4-bit linears + group-128 scales/zeros + g_idx, 16-bit embeddings",
            "gptq",
            "float16",
        ),
        WeightFormat("q4_0", 4.5, 4.5, 32, "GGUF Q4_0: 32 weights in 18 bytes"),
        WeightFormat("q4_1", 5.0, 5.0, 32, "GGUF Q4_1: 32 weights in 20 bytes"),
        WeightFormat("q8_0", 8.5, 8.5, 32, "GGUF Q8_0: 32 weights in 34 bytes"),
        WeightFormat("q6_k", 6.5625, 6.5625, 32, "GGUF Q6_K: 256 weights in 210 bytes"),
        WeightFormat("q4_k_m", 4.89, 4.89, 32, "GGUF Q4_K_M mix, file average 4.89 bits"),
        WeightFormat("q5_k_m", 5.70, 5.70, 32, "GGUF Q5_K_M mix, file average 5.70 bits"),
    )
}

_ALIASES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "int4": "awq",
    "gptq_int4": "gptq",
    "awq_int4": "awq",
}

KV_DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}


def weight_format(name: str) -> WeightFormat:
    """The format called `name` (case-insensitive); a PlanError listing the known ones otherwise."""
    key = name.strip().lower().replace("-", "_")
    key = _ALIASES.get(key, key)
    fmt = WEIGHT_FORMATS.get(key)
    if fmt is None:
        known = ", ".join(WEIGHT_FORMATS)
        raise PlanError(f"unknown weight format {name!r}; known formats: {known}")
    return fmt


def kv_dtype_bytes(kv_dtype: str) -> int:
    """Bytes per cached K or V element for a KV-cache dtype."""
    size = KV_DTYPE_BYTES.get(kv_dtype.strip().lower())
    if size is None:
        known = ", ".join(KV_DTYPE_BYTES)
        raise PlanError(f"unknown KV cache dtype {kv_dtype!r}; known dtypes: {known}")
    return size
