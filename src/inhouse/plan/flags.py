"""Recommended launch flags for `inhouse serve` and `vllm serve`, from a Plan."""

from __future__ import annotations

from inhouse.plan.formats import WeightFormat, kv_dtype_bytes, weight_format
from inhouse.plan.planner import Plan
from inhouse.plan.units import MIB

BATCHED_TOKENS_CAP = 8192  # seed 004: 4096–8192 for chat; larger favours throughput over TTFT


def _weights_format(plan: Plan) -> WeightFormat | None:
    name = plan.inputs.weights or plan.model.weights_format
    return None if name == "gguf" else weight_format(name)


def _dtype(plan: Plan) -> str:
    fmt = _weights_format(plan)
    return fmt.activation_dtype if fmt else "bfloat16"


def _batched_tokens(plan: Plan) -> int:
    return min(BATCHED_TOKENS_CAP, plan.max_model_len)


def inhouse_serve_flags(plan: Plan) -> list[str]:
    """Flags for `inhouse serve`, with the KV budget given explicitly (whole MiB, rounded down)."""
    return [
        "--max-model-len",
        str(plan.max_model_len),
        "--max-num-seqs",
        str(plan.max_num_seqs),
        "--max-num-batched-tokens",
        str(_batched_tokens(plan)),
        "--kv-cache-memory",
        f"{max(plan.kv_budget, 0) // MIB}MiB",
        "--dtype",
        _dtype(plan),
    ]


def vllm_serve_flags(plan: Plan) -> list[str]:
    """Flags for `vllm serve`: vLLM measures the KV budget itself from --gpu-memory-utilization."""
    flags = [
        "--max-model-len",
        str(plan.max_model_len),
        "--gpu-memory-utilization",
        f"{plan.inputs.util:g}",
        "--max-num-seqs",
        str(plan.max_num_seqs),
        "--max-num-batched-tokens",
        str(_batched_tokens(plan)),
        "--dtype",
        _dtype(plan),
    ]
    if plan.inputs.tp > 1:
        flags += ["--tensor-parallel-size", str(plan.inputs.tp)]
    fmt = _weights_format(plan)
    if fmt and fmt.vllm_quantization:
        flags += ["--quantization", fmt.vllm_quantization]
    if kv_dtype_bytes(plan.inputs.kv_dtype) == 1:
        flags += ["--kv-cache-dtype", "fp8"]  # vLLM's 8-bit KV cache is fp8, int8 included
    return flags


def command_line(program: str, model: str, flags: list[str]) -> str:
    """A shell line with one flag and its value per continued line."""
    pairs = [f"{flags[i]} {flags[i + 1]}" for i in range(0, len(flags), 2)]
    return " \\\n  ".join([f"{program} {model}", *pairs])
