"""The engine's adapter slots: which adapter holds which slot, written into every
projection's ``LoraStack``.

Every call comes from the engine thread (``AsyncEngine`` runs loads and unloads between
steps), so a slot is never rewritten under a step that reads it. An unloaded adapter's
slot is taken again only once no sequence of it is left (``in_use``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from inhouse.engine.errors import AdapterError
from inhouse.engine.lora.peft_adapter import PROJECTIONS, AdapterWeights, part_sizes
from inhouse.engine.lora.stack import LoraStack
from inhouse.engine.models.llama import LlamaForCausalLM


@dataclass(frozen=True, slots=True)
class LoadedAdapter:
    """An adapter in a slot: what requests name it by, and what its cache blocks are keyed by."""

    name: str
    slot: int
    path: Path
    digest: str
    rank: int


def halves_dtype(quantization: str, dtype: torch.dtype) -> torch.dtype:
    """The adapters' halves beside a model of this weight format and dtype: float32 beside
    exact float32 weights (PEFT's own numbers), int8 codes with float scales beside int8/int4
    ones (as the base's own blocks: a quarter of float32's bytes each step reads), bfloat16
    otherwise."""
    if quantization == "none" and dtype == torch.float32:
        return torch.float32
    return torch.int8 if quantization in ("q8", "q4") else torch.bfloat16


class AdapterSlots:
    """``max_loras`` slots of rank up to ``max_rank`` on every projection of ``model``; with
    ``kernel``, products by the C++ kernel (see ``LoraStack``), the halves in ``dtype`` (see
    :func:`halves_dtype`)."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        max_loras: int,
        max_rank: int,
        kernel: bool,
        dtype: torch.dtype,
    ) -> None:
        self.max_loras, self.max_rank = max_loras, max_rank
        self.args = model.args
        device = model.rope_cos.device
        self.dtype = dtype
        # one stack of every layer a projection (decode_layers takes 16 tensors a step)
        self.model_stacks = {
            projection: LoraStack(
                max_loras,
                max_rank,
                *part_sizes(model.args, projection),
                device,
                kernel,
                self.dtype,
                layers=len(model.layers),
            )
            for projection in PROJECTIONS
        }
        self.stacks: dict[tuple[int, str], LoraStack] = {}
        for index, layer in enumerate(model.layers):
            linears = (layer.self_attn.qkv_proj, layer.self_attn.o_proj)
            linears += (layer.mlp.gate_up_proj, layer.mlp.down_proj)
            for projection, linear in zip(PROJECTIONS, linears, strict=True):
                stack = self.model_stacks[projection].layer(index)
                self.stacks[index, projection] = linear.lora = stack
        model.lora_weights = [t for stack in self.model_stacks.values() for t in stack.tensors]
        self.adapters: dict[str, LoadedAdapter] = {}

    @property
    def num_bytes(self) -> int:
        """Memory the slots hold, whether filled or not."""
        return sum(stack.num_bytes for stack in self.model_stacks.values())

    def install(
        self, name: str, weights: AdapterWeights, in_use: Callable[[int], bool]
    ) -> LoadedAdapter:
        """Write ``weights`` into a free slot under ``name``; AdapterError if the name is
        taken or every slot is held (by an adapter, or by sequences of an unloaded one)."""
        if name in self.adapters:
            raise AdapterError(f"an adapter named {name!r} is already loaded")
        held = {adapter.slot for adapter in self.adapters.values()}
        free = [s for s in range(self.max_loras) if s not in held and not in_use(s)]
        if not free:
            raise AdapterError(
                f"all {self.max_loras} adapter slots are in use (--max-loras); unload one first"
            )
        slot = free[0]
        self._write(slot, weights)
        adapter = LoadedAdapter(name, slot, weights.path, weights.digest, weights.rank)
        self.adapters[name] = adapter
        return adapter

    def remove(self, name: str) -> LoadedAdapter:
        """Forget ``name``: new requests cannot use it; running ones finish on its slot."""
        adapter = self.adapters.pop(name, None)
        if adapter is None:
            raise KeyError(name)
        return adapter

    def _write(self, slot: int, weights: AdapterWeights) -> None:
        for (layer, projection), stack in self.stacks.items():
            parts = range(len(part_sizes(self.args, projection)[0]))
            stack.write(slot, [weights.parts.get((layer, projection, part)) for part in parts])


def describe_adapters(slots: AdapterSlots | None) -> str:
    """The start-up table's line: the adapters, and the slots with their memory."""
    if slots is None:
        return "off (--lora-modules or --max-loras to serve adapters)"
    names = ", ".join(f"{a.name} (rank {a.rank})" for a in slots.adapters.values()) or "none yet"
    return (
        f"{names}; {slots.max_loras} slots of rank {slots.max_rank}, "
        f"{slots.num_bytes / 2**20:.1f} MiB ({str(slots.dtype).removeprefix('torch.')})"
    )
