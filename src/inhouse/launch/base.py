"""The interface every engine module implements, and the settings a plan hands to it.

An engine turns `LaunchSettings` (what the plan decided) into its own command line,
says which settings it has no flag for (`notes`, never a silent drop), knows where its
program is and how to tell it is installed, and reads its own `/health` answer.
"""

from __future__ import annotations

import shlex
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import StrEnum

from inhouse.launch.metric_names import MetricNames


class EngineMissing(RuntimeError):
    """The engine's program or package is not installed; the message says how to get it."""


@dataclass(frozen=True, slots=True)
class LaunchSettings:
    """What to start, engine-neutral. None means "leave it to the engine's default"."""

    model: str  # a file, a folder or a hub id, as the engine takes it
    gguf: bool = False  # the model is a GGUF file
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_bytes: int | None = None  # KV budget per GPU
    kv_cache_tokens: int | None = None  # what that budget holds, in tokens
    gpu_memory_utilization: float | None = None  # vLLM's share: weights + KV + overhead
    static_memory_fraction: float | None = None  # SGLang's share: weights + KV only
    kv_dtype: str | None = None  # fp32, bf16, fp16, fp8 or int8 (plan names)
    tp: int = 1
    weights: str | None = None  # plan weight-format name when not the checkpoint's own
    vllm_quantization: str | None = None  # the --quantization value vLLM and SGLang know
    dtype: str | None = None  # float16 or bfloat16
    gpu: bool = False  # a GPU deployment (llama.cpp then offloads every layer)
    cpu_cores: tuple[int, ...] = ()  # on a CPU host: the cores this server's threads run on
    manifest: str | None = None  # a verified model manifest, for engines that read one
    lora_modules: tuple[tuple[str, str], ...] = ()  # LoRA adapters (name, path) loaded at start
    max_loras: int = 0  # adapter slots (0: adapters off)
    max_lora_rank: int | None = None  # None: the engine's default (16 for inhouse and vLLM)
    images_per_prompt: int | None = None  # a vision-language model's image limit a prompt
    vision_model_type: str | None = None  # its config's model_type


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a launched replica listens and how the gateway reaches it."""

    host: str
    port: int
    served_name: str
    api_key: str | None = None
    embeddings: bool = False  # also serve the bundled embedding model (inhouse only)


@dataclass(frozen=True, slots=True)
class Command:
    """A launch command: the program's argv, extra environment, and what it could not take."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


class Health(StrEnum):
    READY = "ready"
    LOADING = "loading"
    FAILED = "failed"


@dataclass
class Flags:
    """Flags being built, with a note for every setting the engine has no flag for."""

    argv: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # settings an engine reads only there

    def add(self, *tokens: str) -> None:
        self.argv.extend(tokens)

    def lacks(self, note: str) -> None:
        self.notes.append(note)


def lora_pairs(settings: LaunchSettings) -> list[str]:
    """The LoRA adapters as ``name=path`` values, the spelling every engine here reads."""
    return [f"{name}={path}" for name, path in settings.lora_modules]


class Backend:
    """What the gateway, bench and observe know of one backend kind: the request fields
    it takes, whether it counts tokens, and its metric names (None: no `/metrics` to read)."""

    kind: str  # the gateway's `kind` of an upstream
    features: tuple[str, ...] = ("chat", "completions")  # gateway capabilities
    saltable: bool = False  # accepts vLLM's `cache_salt`
    tokenizes: bool = False  # its `/tokenize` answers a prompt's token count
    prioritized: bool = False  # takes vLLM's per-request `priority` integer
    images: bool = False  # serves a vision-language model's image parts
    metrics: MetricNames | None = None  # what the router, bench and observe read


class HostedBackend(Backend):
    """An OpenAI-compatible API run elsewhere (a fallback): none of the engines' extras."""

    kind = "openai"


class Engine(Backend, ABC):
    """One serving engine: its flags, its program, and how it reports being ready."""

    name: str  # the --engine value
    program: str  # how its command starts, for people
    documented: str  # file under inhouse/launch/documented/ listing its options
    start_timeout_s: float  # how long a cold start may take before it counts as failed
    gguf_only: bool = False  # loads nothing but GGUF files
    safetensors_only: bool = False  # loads no GGUF file: `up` hands it an HF folder of one
    # Its compute threads follow the cores it may run on, step by step: `up` may move a
    # running replica to another share of a CPU host's cores (`launch.cpu_host.pin`).
    follows_cores: bool = False

    @abstractmethod
    def executable(self) -> list[str]:
        """The argv prefix that runs the engine; EngineMissing when it is not installed."""

    @abstractmethod
    def model_args(self, settings: LaunchSettings) -> list[str]:
        """How the engine is told which model to load."""

    @abstractmethod
    def plan_flags(self, settings: LaunchSettings, flags: Flags) -> None:
        """Add the flags that carry the plan, and a note for each one it cannot carry."""

    @abstractmethod
    def serving_flags(self, endpoint: Endpoint, flags: Flags) -> dict[str, str]:
        """Add address, name and metrics flags; return environment (the API key, off `ps`)."""

    @staticmethod
    def address_flags(host: str, port: int, flags: Flags) -> None:
        """Add where it listens: every engine here takes --host and --port."""
        flags.add("--host", host, "--port", str(port))

    def health(self, status: int, body: str) -> Health:
        """Read a `/health` answer: 200 ready, anything else still loading."""
        return Health.READY if status == 200 else Health.LOADING

    def flags(self, settings: LaunchSettings) -> Flags:
        """The model and plan flags, without any address: what `inhouse plan --emit` prints
        (with --port, then `address_flags`)."""
        flags = Flags(argv=self.model_args(settings))
        self.plan_flags(settings, flags)
        return flags

    def command(self, settings: LaunchSettings, endpoint: Endpoint) -> Command:
        """The full command that starts one replica listening on `endpoint`."""
        flags = self.flags(settings)
        env = self.serving_flags(endpoint, flags)
        return Command([*self.executable(), *flags.argv], {**flags.env, **env}, tuple(flags.notes))


def shell_line(program: str, argv: list[str], env: dict[str, str] | None = None) -> str:
    """A shell line with one option (and its values) per continued line, after `env`."""
    assignments = [f"{name}={shlex.quote(value)}" for name, value in (env or {}).items()]
    lines = [" ".join([*assignments, program])]
    for token in map(shlex.quote, argv):
        if token.startswith("-") or len(lines) == 1:
            lines.append(token)
        else:
            lines[-1] += f" {token}"
    head = lines[0] if len(lines) == 1 else f"{lines[0]} {lines.pop(1)}"
    return " \\\n  ".join([head, *lines[1:]])
