"""vLLM's `vllm serve`: it measures the KV budget itself from --gpu-memory-utilization."""

from __future__ import annotations

import shutil

from inhouse.launch.base import Endpoint, Engine, EngineMissing, Flags, LaunchSettings
from inhouse.launch.metric_names import vllm_names


class VllmEngine(Engine):
    name = "vllm"
    kind = "vllm"
    program = "vllm serve"
    documented = "vllm.txt"
    start_timeout_s = 1800.0  # weights download, load, torch.compile and CUDA graphs
    features = ("chat", "completions", "tools", "json_schema")
    saltable = tokenizes = True
    prioritized = True  # with --scheduling-policy priority, which serving_flags passes
    metrics = vllm_names("vllm:", older=True)

    def executable(self) -> list[str]:
        found = shutil.which("vllm")
        if found is None:
            raise EngineMissing(
                "vLLM is not installed: `pip install vllm` on a machine with a CUDA GPU "
                "(it brings its own torch build)"
            )
        return [found, "serve"]

    def model_args(self, settings: LaunchSettings) -> list[str]:
        return [settings.model]

    def plan_flags(self, settings: LaunchSettings, flags: Flags) -> None:
        if settings.max_model_len:
            flags.add("--max-model-len", str(settings.max_model_len))
        if settings.gpu_memory_utilization is not None:
            flags.add("--gpu-memory-utilization", f"{settings.gpu_memory_utilization:g}")
        if settings.max_num_seqs:
            flags.add("--max-num-seqs", str(settings.max_num_seqs))
        if settings.max_num_batched_tokens:
            flags.add("--max-num-batched-tokens", str(settings.max_num_batched_tokens))
        if settings.dtype:
            flags.add("--dtype", settings.dtype)
        if settings.tp > 1:
            flags.add("--tensor-parallel-size", str(settings.tp))
        if settings.vllm_quantization:
            flags.add("--quantization", settings.vllm_quantization)
        elif settings.weights:
            flags.lacks(
                f"vLLM has no --quantization for {settings.weights}: "
                "it reads a quantized checkpoint's own quantization_config"
            )
        if settings.kv_dtype in ("fp8", "int8"):
            flags.add("--kv-cache-dtype", "fp8")
            if settings.kv_dtype == "int8":
                flags.lacks("vLLM has no int8 KV cache: fp8, its 8-bit type, instead")
        elif settings.kv_dtype == "fp32":
            flags.lacks("vLLM has no fp32 KV cache on GPUs: it caches in --dtype")

    def serving_flags(self, endpoint: Endpoint, flags: Flags) -> dict[str, str]:
        flags.add("--host", endpoint.host, "--port", str(endpoint.port))
        flags.add("--served-model-name", endpoint.served_name)
        # The gateway sends each key's class as `priority`, which vLLM refuses (400) unless
        # it schedules by priority.
        flags.add("--scheduling-policy", "priority")
        return {"VLLM_API_KEY": endpoint.api_key} if endpoint.api_key else {}
