"""Read a PEFT LoRA adapter (``adapter_config.json`` + ``adapter_model.safetensors``) into
the decoder's fused projections.

PEFT adds ``lora_B(lora_A(x)) * scaling`` to each target projection's output, ``scaling``
being ``lora_alpha / r`` (``lora_alpha / sqrt(r)`` with rsLoRA). The decoder fuses q/k/v
and gate/up into one matmul each, so an adapter's parts are laid side by side: each part's
A rows stacked at its own place in the rank dimension, its B block on its own output rows,
its scaling on those rows. Only what the slots hold is supported: LoRA (no DoRA) on the
attention and MLP projections, no biases, no extra trained modules; anything else is
refused with the reason.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from inhouse.engine.errors import AdapterError
from inhouse.engine.lora.stack import PartWeights
from inhouse.engine.models.llama import LlamaArgs

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# checkpoint projection -> (fused projection of the decoder, its part there)
PARTS = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "o_proj": ("o_proj", 0),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
    "down_proj": ("down_proj", 0),
}
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
_KEY = re.compile(
    r"^(?:base_model\.model\.)?(?:model\.)?layers\.(\d+)\.(?:self_attn|mlp)\."
    r"(\w+)\.lora_([AB])(?:\.\w+)?\.weight$"
)


@dataclass(frozen=True, slots=True)
class AdapterWeights:
    """An adapter as read: its parts by ``(layer, fused projection, part)``, its rank and
    a digest of its files (what the prefix cache keys its blocks by)."""

    path: Path
    parts: dict[tuple[int, str, int], PartWeights]
    rank: int
    digest: str

    @property
    def num_bytes(self) -> int:
        return sum(p.a.nbytes + p.b.nbytes for p in self.parts.values())


def part_sizes(args: LlamaArgs, projection: str) -> tuple[list[int], int]:
    """Output rows of each part of a fused projection, and its input width."""
    q, kv = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
    return {
        "qkv_proj": ([q, kv, kv], args.hidden_size),
        "o_proj": ([args.hidden_size], q),
        "gate_up_proj": ([args.intermediate_size] * 2, args.hidden_size),
        "down_proj": ([args.hidden_size], args.intermediate_size),
    }[projection]


def read_adapter(path: str | Path, args: LlamaArgs, max_rank: int) -> AdapterWeights:
    """The adapter at ``path`` checked against the base's shape and ``max_rank``."""
    folder = Path(path)
    config_file, weights_file = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not config_file.is_file() or not weights_file.is_file():
        raise AdapterError(
            f"{folder} is not a PEFT LoRA adapter: it needs {CONFIG_FILE} and {WEIGHTS_FILE}"
        )
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{config_file}: {exc}") from None
    _check_config(config, config_file)
    tensors = load_file(weights_file)
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        if match is None or match[2] not in PARTS:
            raise AdapterError(
                f"{weights_file}: {key!r} is not a LoRA pair of a projection this engine adapts"
            )
        pairs.setdefault((int(match[1]), match[2]), {})[match[3]] = tensor.float()
    parts = {}
    rank = 0
    for (layer, name), pair in pairs.items():
        parts[_place(layer, name)] = _part(pair, layer, name, config, args, max_rank)
        rank = max(rank, parts[_place(layer, name)].a.shape[0])
    digest = hashlib.sha256(config_file.read_bytes() + weights_file.read_bytes()).hexdigest()
    return AdapterWeights(folder, parts, rank, digest)


def _place(layer: int, name: str) -> tuple[int, str, int]:
    projection, part = PARTS[name]
    return layer, projection, part


def _check_config(config: dict, where: Path) -> None:
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{where}: peft_type {config.get('peft_type')!r}; only LORA is served")
    unsupported = {
        "use_dora": bool(config.get("use_dora")),
        "bias": config.get("bias", "none") != "none",
        "modules_to_save": bool(config.get("modules_to_save")),
        "rank_pattern": bool(config.get("rank_pattern")),
        "alpha_pattern": bool(config.get("alpha_pattern")),
        "fan_in_fan_out": bool(config.get("fan_in_fan_out")),
    }
    named = [name for name, present in unsupported.items() if present]
    if named:
        raise AdapterError(
            f"{where}: {', '.join(named)} not supported (plain LoRA on the projections only)"
        )


def _part(
    pair: dict[str, torch.Tensor],
    layer: int,
    name: str,
    config: dict,
    args: LlamaArgs,
    max_rank: int,
) -> PartWeights:
    where = f"layer {layer} {name}"
    if set(pair) != {"A", "B"}:
        raise AdapterError(f"{where}: lora_A and lora_B must both be present")
    a, b = pair["A"], pair["B"]
    if layer >= args.num_layers:
        raise AdapterError(f"{where}: the base model has {args.num_layers} layers")
    projection, part = PARTS[name]
    outs, width = part_sizes(args, projection)
    r = a.shape[0]
    if a.shape != (r, width) or b.shape != (outs[part], r):
        raise AdapterError(
            f"{where}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not fit the base's "
            f"({outs[part]} x {width}) projection"
        )
    if r > max_rank:
        raise AdapterError(f"{where}: rank {r} is above --max-lora-rank {max_rank}")
    alpha = float(config.get("lora_alpha", r))
    scaling = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
    return PartWeights(a.contiguous(), b.contiguous(), scaling)
