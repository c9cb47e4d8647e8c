"""SGLang's `python -m sglang.launch_server`: a static share for weights + KV pool.

SGLang's --mem-fraction-static covers the weights and the KV pool, not activations and
CUDA graphs; the plan's utilization covers those too, so the same pool is the
utilization minus the overhead's share. --max-total-tokens pins the pool to the plan.
"""

from __future__ import annotations

import importlib.util
import math
import sys

from inhouse.launch.base import (
    Endpoint,
    Engine,
    EngineMissing,
    Flags,
    LaunchSettings,
    lora_pairs,
)
from inhouse.launch.metric_names import MetricNames


class SglangEngine(Engine):
    name = "sglang"
    kind = "sglang"
    program = "python -m sglang.launch_server"
    documented = "sglang.txt"
    start_timeout_s = 1800.0
    features = ("chat", "completions", "tools", "json_schema")
    images = True
    saltable = True  # vLLM's `cache_salt`, since SGLang 0.5
    tokenizes = True
    # SGLang 0.5.23's sglang.srt.observability.metrics_collector
    metrics = MetricNames(
        "sglang:",
        running=("sglang:num_running_reqs",),
        waiting=("sglang:num_queue_reqs",),
        kv_usage=("sglang:token_usage",),
    )

    def executable(self) -> list[str]:
        if importlib.util.find_spec("sglang") is None:
            raise EngineMissing(
                "SGLang is not installed: `pip install sglang` on a machine with a CUDA GPU "
                "(it brings its own torch build)"
            )
        return [sys.executable, "-m", "sglang.launch_server"]

    def model_args(self, settings: LaunchSettings) -> list[str]:
        return ["--model-path", settings.model]

    def plan_flags(self, settings: LaunchSettings, flags: Flags) -> None:
        if settings.max_model_len:
            flags.add("--context-length", str(settings.max_model_len))
        if settings.static_memory_fraction is not None:
            share = math.floor(settings.static_memory_fraction * 100) / 100
            flags.add("--mem-fraction-static", f"{share:g}")
        if settings.kv_cache_tokens:
            flags.add("--max-total-tokens", str(settings.kv_cache_tokens))
        if settings.max_num_seqs:
            flags.add("--max-running-requests", str(settings.max_num_seqs))
        if settings.max_num_batched_tokens:
            flags.add("--chunked-prefill-size", str(settings.max_num_batched_tokens))
        if settings.dtype:
            flags.add("--dtype", settings.dtype)
        if settings.tp > 1:
            flags.add("--tp-size", str(settings.tp))
        if settings.vllm_quantization:
            flags.add("--quantization", settings.vllm_quantization)
        elif settings.weights:
            flags.lacks(
                f"SGLang has no --quantization for {settings.weights}: "
                "it reads a quantized checkpoint's own quantization_config"
            )
        if settings.max_loras:
            flags.add("--enable-lora")
            if pairs := lora_pairs(settings):
                flags.add("--lora-paths", *pairs)
            flags.add("--max-loras-per-batch", str(settings.max_loras))
            if settings.max_lora_rank:
                flags.add("--max-lora-rank", str(settings.max_lora_rank))
        if settings.kv_dtype == "fp8":
            flags.add("--kv-cache-dtype", "fp8_e4m3")
        elif settings.kv_dtype in ("int8", "fp32"):
            flags.lacks(f"SGLang has no {settings.kv_dtype} KV cache: it caches in --dtype")

    def serving_flags(self, endpoint: Endpoint, flags: Flags) -> dict[str, str]:
        self.address_flags(endpoint.host, endpoint.port, flags)
        flags.add("--served-model-name", endpoint.served_name, "--enable-metrics")
        if endpoint.api_key:
            flags.add("--api-key", endpoint.api_key)  # SGLang reads it from no variable
        return {}
