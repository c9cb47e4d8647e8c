"""llama.cpp's `llama-server`: GGUF files, slots sharing one unified KV pool.

The plan maps onto it as vLLM's semantics do: `--ctx-size` is the whole KV pool in
tokens, `--parallel` the sequences at once, and `--kv-unified-per-slot` caps one
request at max-model-len. The binary is built from the llama.cpp that the
llama-cpp-python 0.3.36 source distribution vendors (`make llama-server`).
"""

from __future__ import annotations

from pathlib import Path

from inhouse.launch.base import Endpoint, Engine, Flags, LaunchSettings
from inhouse.launch.installed import engine_cache, find_program, require
from inhouse.launch.metric_names import MetricNames

LLAMA_CPP_PYTHON = "0.3.36"  # whose sdist vendors the llama.cpp we build and checked
KV_TYPES = {"fp32": "f32", "fp16": "f16", "bf16": "bf16", "int8": "q8_0", "fp8": "q8_0"}


def cache_dir() -> Path:
    """Where `make llama-server` unpacks and builds llama.cpp."""
    return engine_cache("llama.cpp")


def built_binary() -> Path:
    """The llama-server that `make llama-server` builds."""
    tree = cache_dir() / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    return tree / "build" / "bin" / "llama-server"


def find_llama_server() -> Path | None:
    """$INHOUSE_LLAMA_SERVER, else the one `make llama-server` built, else one on PATH."""
    return find_program("INHOUSE_LLAMA_SERVER", built_binary(), "llama-server")


class LlamaCppEngine(Engine):
    name = "llama.cpp"
    kind = "llama.cpp"
    program = "llama-server"
    documented = "llama.cpp.txt"
    start_timeout_s = 300.0
    features = ("chat", "completions", "tools", "json_schema")
    gguf_only = True
    # No `cache_salt` field, no `/tokenize` count; with `--metrics`, requests no slot took
    # yet are "deferred", and it exports no KV usage.
    metrics = MetricNames(
        "llamacpp:",
        running=("llamacpp:requests_processing",),
        waiting=("llamacpp:requests_deferred",),
    )

    def executable(self) -> list[str]:
        binary = require(
            find_llama_server(),
            "llama.cpp's llama-server is not installed: run `make llama-server` (builds it "
            f"from the llama-cpp-python {LLAMA_CPP_PYTHON} source, ~10 minutes on 2 cores), "
            "put llama-server on PATH, or set INHOUSE_LLAMA_SERVER to its path",
        )
        return [str(binary)]

    def model_args(self, settings: LaunchSettings) -> list[str]:
        return ["--model", settings.model]

    def plan_flags(self, settings: LaunchSettings, flags: Flags) -> None:
        if not settings.gguf:
            flags.lacks(
                "llama.cpp loads GGUF files only: convert the checkpoint with llama.cpp's "
                "convert_hf_to_gguf.py and pass the .gguf file"
            )
        if settings.kv_cache_tokens:
            flags.add("--ctx-size", str(settings.kv_cache_tokens))
        if settings.max_num_seqs:
            flags.add("--parallel", str(settings.max_num_seqs))
        flags.add("--kv-unified")
        if settings.max_model_len:
            flags.add("--kv-unified-per-slot", str(settings.max_model_len))
        if settings.max_num_batched_tokens:
            flags.add("--batch-size", str(settings.max_num_batched_tokens))
        if settings.kv_dtype in KV_TYPES:
            kv = KV_TYPES[settings.kv_dtype]
            flags.add("--cache-type-k", kv, "--cache-type-v", kv)
            if settings.kv_dtype == "fp8":
                flags.lacks("llama.cpp has no fp8 KV cache: q8_0, its 8-bit type, instead")
        if settings.gpu:
            flags.add("--n-gpu-layers", "all")
            flags.lacks(
                "llama.cpp has no memory-utilization share: --ctx-size sizes the KV pool "
                "the plan's budget holds"
            )
        if settings.tp > 1:
            flags.add("--split-mode", "layer", "--tensor-split", ",".join(["1"] * settings.tp))
            flags.lacks(
                f"llama.cpp has no tensor parallelism: it splits the layers over the {settings.tp} "
                "GPUs (pipelined), so one sequence runs on one GPU at a time"
            )
        if settings.max_loras:
            names = ", ".join(name for name, _ in settings.lora_modules)
            flags.lacks(
                "llama.cpp takes LoRA adapters only as GGUF files (--lora FILE, converted "
                "with llama.cpp's convert_lora_to_gguf.py), not PEFT folders, and has no "
                "adapter slots" + (f": {names} not passed" if names else "")
            )
        if settings.weights and not settings.gguf:
            flags.lacks(f"llama.cpp has no {settings.weights} weights: quantize to a GGUF type")

    def serving_flags(self, endpoint: Endpoint, flags: Flags) -> dict[str, str]:
        self.address_flags(endpoint.host, endpoint.port, flags)
        flags.add("--alias", endpoint.served_name, "--metrics", "--no-webui")
        return {"LLAMA_API_KEY": endpoint.api_key} if endpoint.api_key else {}
