"""`inhouse serve`, our own engine: flags in vLLM's spelling, the KV budget given in bytes."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from inhouse.launch.base import Endpoint, Engine, Flags, Health, LaunchSettings, lora_pairs
from inhouse.launch.metric_names import inhouse_names
from inhouse.plan.planner import Plan
from inhouse.plan.serve_path import Host, ServePath, choose_path
from inhouse.plan.units import MIB
from inhouse.plan.vision import SERVED_MODEL_TYPES

# --dtype values `inhouse serve` accepts, by the plan's activation dtype.
DTYPES = {"bfloat16": "bfloat16", "float16": "float16"}
# A CPU host the plan does not see: the C++ kernels build wherever there is a C++ compiler.
PLANNED_CPU = Host(device="cpu", kernels_isa="the host's ISA")


def planned_path(plan: Plan) -> ServePath | None:
    """The path `inhouse serve` chooses by itself (no --dtype, no --quantization) on the CPU
    host a --cpu plan is for, by serve's own rule; None for a GPU plan."""
    if not plan.inputs.cpu:
        return None
    tensors = plan.model.gguf_tensors
    return choose_path("auto", "auto", PLANNED_CPU, tensors.main_type if tensors else None)


def inhouse_command() -> list[str]:
    """How to run the `inhouse` CLI of this very installation."""
    script = Path(sys.executable).with_name("inhouse")
    if script.exists():
        return [str(script)]
    found = shutil.which("inhouse")
    return [found] if found else [sys.executable, "-c", "from inhouse.cli import main; main()"]


class InhouseEngine(Engine):
    name = "inhouse"
    kind = "inhouse"
    program = "inhouse serve"
    documented = ""  # our own flags: `inhouse serve --help` is their documentation
    start_timeout_s = 600.0
    features = ("chat", "completions", "tools", "json_schema")
    images = True  # an Idefics3 model's (SERVED_MODEL_TYPES); other families are refused
    saltable = tokenizes = prioritized = True
    follows_cores = True  # each step's threads are its affinity's cores (engine.threads)
    metrics = inhouse_names()  # what server/metrics.py registers

    def executable(self) -> list[str]:
        return [*inhouse_command(), "serve"]

    def model_args(self, settings: LaunchSettings) -> list[str]:
        """The model, or the manifest that names it (serve verifies it again at start)."""
        return ["--manifest", settings.manifest] if settings.manifest else [settings.model]

    def plan_flags(self, settings: LaunchSettings, flags: Flags) -> None:
        if settings.max_model_len:
            flags.add("--max-model-len", str(settings.max_model_len))
        if settings.max_num_seqs:
            flags.add("--max-num-seqs", str(settings.max_num_seqs))
        if settings.max_num_batched_tokens:
            flags.add("--max-num-batched-tokens", str(settings.max_num_batched_tokens))
        if settings.kv_cache_bytes is not None:
            flags.add("--kv-cache-memory", f"{settings.kv_cache_bytes // MIB}MiB")
        if settings.dtype and settings.gpu:
            # On a CPU serve's own choice is its fastest path (see `planned_path`); an
            # explicit --dtype keeps the checkpoint's weights in torch matmuls, far slower.
            flags.add("--dtype", DTYPES[settings.dtype])
        for pair in lora_pairs(settings):
            flags.add("--lora-modules", pair)  # a list option: once per adapter
        if settings.max_loras:
            flags.add("--max-loras", str(settings.max_loras))
        if settings.max_lora_rank:
            flags.add("--max-lora-rank", str(settings.max_lora_rank))
        if settings.tp > 1:
            flags.lacks(
                f"inhouse serve has no tensor parallelism: it runs on one device, not {settings.tp}"
            )
        if settings.kv_dtype in ("fp8", "int8"):
            flags.lacks(f"inhouse serve has no {settings.kv_dtype} KV cache: it caches in --dtype")
        if settings.weights:
            flags.lacks(
                f"inhouse serve does not load {settings.weights} weights "
                "(it reads 16-bit safetensors and GGUF)"
            )
        if settings.images_per_prompt is not None:
            if settings.vision_model_type in SERVED_MODEL_TYPES:
                flags.add(
                    "--limit-mm-per-prompt", json.dumps({"image": settings.images_per_prompt})
                )
            else:
                flags.lacks(
                    f"inhouse serve encodes images of {', '.join(sorted(SERVED_MODEL_TYPES))} "
                    f"models, not {settings.vision_model_type}: serve this one with vLLM"
                )

    def serving_flags(self, endpoint: Endpoint, flags: Flags) -> dict[str, str]:
        self.address_flags(endpoint.host, endpoint.port, flags)
        flags.add("--served-model-name", endpoint.served_name)
        # The gateway in front sends each key's class as `priority`: schedule by it.
        flags.add("--scheduling-policy", "priority")
        if not endpoint.embeddings:
            flags.add("--embedding-model", "none")
        return {"INHOUSE_API_KEY": endpoint.api_key} if endpoint.api_key else {}

    def health(self, status: int, body: str) -> Health:
        """200 ready; 503 with `"status": "failed"` means the model could not be loaded."""
        if status == 200:
            return Health.READY
        try:
            failed = json.loads(body).get("status") == "failed"
        except (ValueError, AttributeError):
            failed = False
        return Health.FAILED if failed else Health.LOADING
