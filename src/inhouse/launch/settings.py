"""From a Plan to engine-neutral LaunchSettings: the numbers every engine is started with."""

from __future__ import annotations

from inhouse.launch.base import LaunchSettings
from inhouse.plan.formats import weight_format
from inhouse.plan.planner import Plan


def settings_from_plan(plan: Plan) -> LaunchSettings:
    """Everything the plan decided, per GPU where it is memory (on a CPU host, for the
    server's cores 0..n-1)."""
    name = plan.inputs.weights or plan.model.weights_format
    fmt = None if name == "gguf" else weight_format(name)
    kv_budget = max(plan.kv_budget, 0)
    # SGLang's --mem-fraction-static covers weights + KV pool; the plan's util also covers
    # the overhead, so the same KV pool is util minus the overhead's share.
    static = plan.inputs.util - plan.overhead_bytes / plan.vram_bytes if plan.vram_bytes else None
    return LaunchSettings(
        model=plan.model.reference,
        gguf=plan.model.gguf_tensors is not None,
        max_model_len=plan.max_model_len,
        max_num_seqs=plan.max_num_seqs,
        max_num_batched_tokens=plan.max_num_batched_tokens,
        kv_cache_bytes=kv_budget,
        kv_cache_tokens=plan.kv_cache.num_tokens,
        gpu_memory_utilization=plan.inputs.util,
        static_memory_fraction=static,
        kv_dtype=plan.inputs.kv_dtype,
        tp=plan.inputs.tp,
        weights=None if fmt is None or fmt.name in ("bf16", "fp16") else fmt.name,
        vllm_quantization=fmt.vllm_quantization if fmt else None,
        dtype=fmt.activation_dtype if fmt else "bfloat16",
        gpu=plan.inputs.cpu_cores is None,
        cpu_cores=tuple(range(plan.inputs.cpu_cores or 0)),
        lora_modules=plan.inputs.lora_modules,
        max_loras=plan.adapters.slots,
        max_lora_rank=plan.adapters.max_rank if plan.adapters.slots else None,
        images_per_prompt=plan.vision.images if plan.vision.encoder else None,
        vision_model_type=plan.vision.encoder.model_type if plan.vision.encoder else None,
    )
