"""LoRA adapter slots: the ``--lora-modules`` list, how many slots, and the memory they hold.

An engine that serves adapters keeps ``max_loras`` slots of rank up to ``max_lora_rank`` on
every layer's four fused projections, allocated at start whether filled or not, so the
plan takes them out of the KV budget. Two layouts, each engine's own:

    inhouse serve, per projection (parts = 3 for qkv, 2 for gate_up, else 1):
        cols = round_up(parts · rank, 8), rows = round_up(out, 16)
        slot = (in · cols + cols · rows) · h + rows · 4 B     a_t, b_t, the per-row scale
        h = 2 B (bfloat16; the plan's count, an upper bound), 1 B beside int8/int4 weights,
        or 4 B where the engine is exact (float32, unquantized weights: never what a plan
        starts)
    vLLM, per slice (lora_dtype auto: the model dtype, vllm.config.lora; one slice a part;
    rank: the smallest of its --max-lora-rank choices that holds it):
        slot = Σ slices (rank · in + out_slice · rank) · 2 B
               + embed_tokens (vocab · rank + hidden · rank) + lm_head (the same)

Dense projections only: a mixture of experts' experts are not counted. Pure Python.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from inhouse.plan.errors import PlanError
from inhouse.plan.spec import ModelSpec

DEFAULT_MAX_LORA_RANK = 16  # vLLM's --max-lora-rank default, and inhouse serve's
DEFAULT_MAX_LORAS = 4  # slots once any adapter is given (room for loads at run time)
RANK_STEP = 8  # inhouse's kernel lanes: a slot's rank columns come in eights
OUT_BLOCK = 16  # inhouse's B blocks: a projection's output rows padded to sixteens
SCALE_BYTES = 4  # inhouse's per-row scale is float32
LAYOUT_BYTES = 8  # inhouse's per-block layout entries are int64
VLLM_VALUE_BYTES = 2  # vLLM keeps them in the model's dtype (bf16 or fp16 here)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # its --max-lora-rank choices
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")


@dataclass(frozen=True, slots=True)
class Projection:
    """One fused projection of a layer: its input width and each part's output rows."""

    name: str
    in_features: int
    outs: tuple[int, ...]
    column_parallel: bool  # vLLM splits its outputs (else its inputs) across TP


def projections(spec: ModelSpec) -> tuple[Projection, ...]:
    """A layer's qkv_proj, o_proj, gate_up_proj and down_proj, as the engines fuse them."""
    q = spec.num_attention_heads * spec.head_dim
    kv = spec.num_key_value_heads * spec.head_dim
    hidden, mlp = spec.hidden_size, spec.intermediate_size
    return (
        Projection("qkv_proj", hidden, (q, kv, kv), True),
        Projection("o_proj", q, (hidden,), False),
        Projection("gate_up_proj", hidden, (mlp, mlp), True),
        Projection("down_proj", mlp, (hidden,), False),
    )


def inhouse_slot_bytes(spec: ModelSpec, max_rank: int, value_bytes: int = 2) -> int:
    """One slot's bytes in ``inhouse serve`` (``AdapterSlots.num_bytes`` ÷ slots): halves of
    ``value_bytes`` a value (bfloat16's 2; 4 beside exact float32 weights, 1 beside int8/int4
    ones); a B block holds one part's rank rows where every part starts on a block, else
    every part's."""
    half = value_bytes
    part = -(-max_rank // RANK_STEP) * RANK_STEP
    total = 0
    for p in projections(spec):
        cols = len(p.outs) * part
        rows = -(-sum(p.outs) // OUT_BLOCK) * OUT_BLOCK
        own = all(sum(p.outs[:i]) % OUT_BLOCK == 0 for i in range(len(p.outs)))
        total += (p.in_features * cols + (part if own else cols) * rows) * half
        total += rows * SCALE_BYTES + (2 + rows // OUT_BLOCK) * LAYOUT_BYTES
    return spec.num_layers * total


def vllm_rank(max_rank: int) -> int | None:
    """The --max-lora-rank vLLM is given for ``max_rank``: the smallest choice it takes that
    holds it; None above its largest."""
    return min((r for r in VLLM_LORA_RANKS if r >= max_rank), default=None)


def vllm_slot_bytes(spec: ModelSpec, max_rank: int, tp: int = 1) -> int:
    """One slot's bytes per GPU in vLLM: its layers' stacks, embed_tokens' and lm_head's, at
    the rank it is given (``vllm_rank``)."""
    max_rank = vllm_rank(max_rank) or max_rank
    values = 0
    for p in projections(spec):
        split_in, split_out = (1, tp) if p.column_parallel else (tp, 1)
        for out in p.outs:
            values += max_rank * p.in_features // split_in + out // split_out * max_rank
    per_layer = spec.num_layers * values
    vocab = 2 * (spec.vocab_size + spec.hidden_size) * max_rank
    return (per_layer + vocab) * VLLM_VALUE_BYTES


@dataclass(frozen=True, slots=True)
class AdapterMemory:
    """The adapter slots a plan holds, per GPU: the larger of the two engines' layouts."""

    slots: int
    max_rank: int
    inhouse_slot_bytes: int
    vllm_slot_bytes: int

    @property
    def slot_bytes(self) -> int:
        return max(self.inhouse_slot_bytes, self.vllm_slot_bytes)

    @property
    def total(self) -> int:
        return self.slots * self.slot_bytes


def adapter_memory(spec: ModelSpec, slots: int, max_rank: int, tp: int = 1) -> AdapterMemory:
    """The memory of ``slots`` slots of rank ``max_rank`` (0 slots: none)."""
    if slots < 0:
        raise PlanError(f"--max-loras must be 0 or more, not {slots}")
    if max_rank < 1:
        raise PlanError(f"--max-lora-rank must be at least 1, not {max_rank}")
    return AdapterMemory(
        slots, max_rank, inhouse_slot_bytes(spec, max_rank), vllm_slot_bytes(spec, max_rank, tp)
    )


def default_max_loras(modules: int, max_loras: int | None) -> int:
    """``--max-loras`` as serve reads it: given, else max(modules, 4) with any module, else 0."""
    if max_loras is not None:
        if max_loras < modules:
            raise PlanError(
                f"--max-loras {max_loras} is fewer than the {modules} --lora-modules given"
            )
        return max_loras
    return max(modules, DEFAULT_MAX_LORAS) if modules else 0


def parse_lora_modules(values: list[str]) -> dict[str, str]:
    """``--lora-modules`` as vLLM spells it, ``name=path`` or JSON ``{"name", "path"}``:
    adapter paths by name; PlanError for a malformed or repeated entry."""
    modules: dict[str, str] = {}
    for value in values:
        name, path = _one(value.strip())
        if not NAME.match(name):
            raise PlanError(
                f"--lora-modules: {name!r} is not a usable adapter name (letters, digits and "
                "._:/@+- , at most 128)"
            )
        if name in modules:
            raise PlanError(f"--lora-modules: {name!r} is given twice")
        modules[name] = path
    return modules


def _one(value: str) -> tuple[str, str]:
    if value.startswith("{"):
        try:
            entry = json.loads(value)
            return str(entry["name"]), str(entry["path"])
        except (ValueError, KeyError, TypeError):
            raise PlanError(
                f'--lora-modules: {value!r} is not {{"name": ..., "path": ...}}'
            ) from None
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise PlanError(f"--lora-modules: {value!r} is not name=path")
    return name, path
