"""What `inhouse up` starts each replica with: the plan's settings (with --gpu/--vram) or the
engine's own sizing, the LoRA adapters every replica loads, and the HF folder an engine that
reads no GGUF is served instead."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from inhouse.launch.base import Engine, LaunchSettings
from inhouse.plan.adapters import DEFAULT_MAX_LORA_RANK, default_max_loras, parse_lora_modules
from inhouse.plan.errors import PlanError
from inhouse.plan.units import parse_bytes

if TYPE_CHECKING:
    from inhouse.plan.planner import PlanInputs

EXIT_NO_REPLICA = 1


@dataclass(frozen=True, slots=True)
class AdapterOptions:
    """`--lora-modules` (local paths made absolute: replicas may start elsewhere),
    `--max-loras` and `--max-lora-rank`, as `inhouse serve` reads them."""

    modules: tuple[tuple[str, str], ...] = ()
    max_loras: int | None = None
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK

    @classmethod
    def parse(
        cls, values: list[str], max_loras: int | None, max_lora_rank: int | None
    ) -> AdapterOptions:
        """The options checked; PlanError for a malformed list or too few slots."""
        modules = tuple(
            (name, str(Path(path).resolve()) if Path(path).exists() else path)
            for name, path in parse_lora_modules(values).items()
        )
        if max_lora_rank is not None and max_lora_rank < 1:
            raise PlanError(f"--max-lora-rank must be at least 1, not {max_lora_rank}")
        default_max_loras(len(modules), max_loras)  # PlanError: fewer slots than modules
        rank = DEFAULT_MAX_LORA_RANK if max_lora_rank is None else max_lora_rank
        return cls(modules, max_loras, rank)

    @property
    def slots(self) -> int:
        return default_max_loras(len(self.modules), self.max_loras)

    @property
    def names(self) -> tuple[str, ...]:
        """The adapters every replica serves from the start (the gateway's `adapters`)."""
        return tuple(name for name, _ in self.modules)

    def apply(self, settings: LaunchSettings) -> LaunchSettings:
        """``settings`` with the adapters and their slots (unchanged without any slot)."""
        if not self.slots:
            return settings
        return dataclasses.replace(
            settings,
            lora_modules=self.modules,
            max_loras=self.slots,
            max_lora_rank=self.max_lora_rank,
        )


def plan_inputs(
    gpu: str | None,
    vram: str | None,
    tp: int,
    util: float,
    avg_context: int | None,
    weights: str | None,
    kv_dtype: str,
    max_model_len: int | None,
    adapters: AdapterOptions,
) -> PlanInputs | None:
    """What to plan for, or None without --gpu/--vram (then each engine sizes itself)."""
    from inhouse.plan.planner import PlanInputs

    if gpu is None and vram is None:
        return None
    return PlanInputs(
        gpu=gpu,
        vram_bytes=parse_bytes(vram) if vram else None,
        tp=tp,
        util=util,
        avg_context=avg_context,
        max_model_len=max_model_len,
        weights=weights,
        kv_dtype=kv_dtype,
        lora_modules=adapters.modules,
        max_loras=adapters.max_loras,
        max_lora_rank=adapters.max_lora_rank,
    )


def launch_settings(
    model: str | None,
    inputs: PlanInputs | None,
    max_model_len: int | None,
    max_num_seqs: int | None,
) -> LaunchSettings:
    """The plan's settings when there are plan inputs; otherwise the engine's own sizing."""
    from inhouse.launch.settings import settings_from_plan
    from inhouse.manifests.bundled import BundledModelMissing
    from inhouse.plan.planner import make_plan
    from inhouse.plan.source import load_model
    from inhouse.plan.vision import DEFAULT_IMAGES_PER_PROMPT

    try:
        source = load_model(model)
    except BundledModelMissing as error:
        raise PlanError(str(error)) from None
    if inputs is None:
        settings = LaunchSettings(
            model=source.reference,
            gguf=source.gguf_tensors is not None,
            max_model_len=max_model_len,
            images_per_prompt=DEFAULT_IMAGES_PER_PROMPT if source.vision else None,
            vision_model_type=source.vision.model_type if source.vision else None,
        )
    else:
        plan = make_plan(source, inputs)
        if not plan.fits:
            typer.echo(f"inhouse up: {source.spec.name} does not fit: {plan.reason}", err=True)
            raise typer.Exit(EXIT_NO_REPLICA)
        settings = settings_from_plan(plan)
    if max_num_seqs is not None:
        settings = dataclasses.replace(settings, max_num_seqs=max_num_seqs)
    return settings


def safetensors_settings(engine: Engine, settings: LaunchSettings) -> LaunchSettings:
    """The settings with the GGUF model swapped for the HF folder written of it (once)."""
    from inhouse.launch.hf_folder import safetensors_folder

    typer.echo(
        f"{engine.name} reads no GGUF: serving it the bfloat16 HF folder of {settings.model}"
    )
    folder = safetensors_folder(Path(settings.model))
    return dataclasses.replace(settings, model=str(folder), gguf=False, dtype="bfloat16")
