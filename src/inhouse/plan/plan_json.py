"""The same numbers as the report, as a JSON-ready dict for machines. Bytes are integers.

Each engine's flags join `flags` from ``inhouse.launch.emit``."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from inhouse.plan.planner import Plan


def plan_as_dict(plan: Plan) -> dict[str, Any]:
    """Every figure of the plan; memory figures are per GPU unless named otherwise."""
    spec = plan.model.spec
    return {
        "model": {
            "name": spec.name,
            "origin": plan.model.origin,
            "total_params": spec.total_params,
            "active_params": spec.active_params,
            "attention": spec.attention_kind,
            "spec": asdict(spec),
        },
        "gpu": {
            "name": plan.gpu.name if plan.gpu else None,
            "count": plan.inputs.tp,
            "memory_bytes": plan.vram_bytes,
            "bandwidth_tb_s": plan.gpu.bandwidth_tb_s if plan.gpu else None,
            "bf16_tflops": plan.gpu.bf16_tflops if plan.gpu else None,
        },
        "inputs": {
            "util": plan.inputs.util,
            "overhead_bytes": plan.overhead_bytes,
            "overhead_is_default": plan.overhead_is_default,
            "avg_context": plan.avg_context,
            "max_model_len": plan.max_model_len,
            "kv_dtype": plan.inputs.kv_dtype,
            "block_size": plan.inputs.block_size,
        },
        "weights": {
            "format": plan.weights.format_name,
            "description": plan.weights.description,
            "total_bytes": plan.weights.total,
            "per_gpu_bytes": plan.weights_per_gpu,
            "read_per_token_bytes": plan.weights.read_per_step(spec),
        },
        "memory": {
            "usable_bytes": int(plan.vram_bytes * plan.inputs.util),
            "kv_budget_bytes": plan.kv_budget,
            "kv_bytes_per_token": plan.kv_bytes_per_token,
            "kv_bytes_per_sequence": plan.kv_bytes_per_sequence,
            "max_concurrent_sequences": plan.max_concurrent,
            "largest_context_tokens": plan.largest_context,
            "fits": plan.fits,
            "reason": plan.reason,
        },
        "adapters": {
            "max_loras": plan.adapters.slots,
            "max_lora_rank": plan.adapters.max_rank,
            "slot_bytes": plan.adapters.slot_bytes,
            "inhouse_slot_bytes": plan.adapters.inhouse_slot_bytes,
            "vllm_slot_bytes": plan.adapters.vllm_slot_bytes,
            "total_bytes": plan.adapters.total,
        },
        "vision": _vision(plan),
        "kv_cache": asdict(plan.kv_cache),
        "context_table": [asdict(row) for row in plan.table],
        "roofline": asdict(plan.roofline) if plan.roofline else None,
        "flags": {"max_num_seqs": plan.max_num_seqs},
    }


def _vision(plan: Plan) -> dict[str, Any] | None:
    """The image encoder's figures (None for a text model)."""
    vision = plan.vision
    if vision.encoder is None:
        return None
    return {
        "family": vision.encoder.family,
        "encoder_params": vision.encoder.params,
        "encoder_layers": vision.encoder.layers,
        "images_per_prompt": vision.images,
        "image_size": list(vision.image_size),
        "tokens_per_image": vision.tokens_per_image,
        "weight_bytes": vision.weight_bytes,
        "activation_bytes": vision.activation_bytes,
    }
