"""Resolve what the user typed into a model: a config.json, a folder, a .gguf file or a name."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inhouse.manifests.bundled import default_chat_model
from inhouse.plan.catalogue import catalogue_spec, checkpoint_format_of
from inhouse.plan.errors import PlanError
from inhouse.plan.gguf_header import TensorInventory, read_gguf
from inhouse.plan.spec import ModelSpec, checkpoint_format, read_config_json, spec_from_hf_config
from inhouse.plan.vision import VisionEncoder, vision_encoder

PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")  # resize policy, seq len


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A model to plan: its spec, the format its weights come in, and where it came from."""

    spec: ModelSpec
    weights_format: str  # a formats.WEIGHT_FORMATS name, or "gguf" for the file's own tensors
    origin: str
    reference: str  # what to pass to a server: the path, or the catalogue name
    gguf_tensors: TensorInventory | None = None
    vision: VisionEncoder | None = None  # a vision-language model's image encoder


def _processor(folder: Path) -> dict[str, Any]:
    """The processor's settings beside a config.json (empty when it has none)."""
    merged: dict[str, Any] = {}
    for name in PROCESSOR_FILES:
        if (folder / name).is_file():
            merged.update(read_config_json(folder / name))
    return merged


def _from_config(path: Path) -> ModelSource:
    config = read_config_json(path)
    name = path.parent.name or path.stem
    return ModelSource(
        spec=spec_from_hf_config(config, name=name),
        weights_format=checkpoint_format(config),
        origin=f"config {path}",
        reference=str(path.parent),
        vision=vision_encoder(config, _processor(path.parent)),
    )


def _from_gguf(path: Path) -> ModelSource:
    model = read_gguf(path)
    return ModelSource(
        spec=model.spec,
        weights_format="gguf",
        origin=f"GGUF header of {path}",
        reference=str(path),
        gguf_tensors=model.tensors,
    )


def load_model(argument: str | Path | None) -> ModelSource:
    """Load a path to config.json, a folder holding one, a .gguf file, or a catalogue name.

    None means the bundled default chat model.
    """
    if argument is None:
        return _from_gguf(default_chat_model())
    path = Path(argument).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise PlanError(f"the folder {path} holds no config.json")
        return _from_config(path / "config.json")
    if path.is_file():
        with path.open("rb") as handle:
            is_gguf = handle.read(4) == b"GGUF"
        return _from_gguf(path) if is_gguf else _from_config(path)
    text = str(argument)
    if "/" in text or text.endswith((".json", ".gguf")):
        raise PlanError(f"no such file: {text}")
    spec = catalogue_spec(text)
    return ModelSource(
        spec=spec,
        weights_format=checkpoint_format_of(spec),
        origin="built-in catalogue",
        reference=spec.name,
    )
