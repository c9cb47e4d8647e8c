"""Read a GGUF file's header: architecture metadata and tensor infos, never tensor data.

`gguf.GGUFReader` memory-maps the file; we touch only the parsed header fields and
each tensor's type and shape, so no page of weight data is read.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inhouse.plan.errors import PlanError
from inhouse.plan.spec import ModelSpec

# Sliding-window layout by architecture: every `n`-th layer is global, the others slide.
_SLIDING_PERIOD = {"gemma2": 2, "gemma3": 6, "cohere2": 4}


@dataclass(frozen=True, slots=True)
class TensorInventory:
    """The real weights in a GGUF file: bytes by role and tensor count by quantization type."""

    total_bytes: int
    embedding_bytes: int
    routed_expert_bytes: int
    tensors_by_type: dict[str, int]

    @property
    def main_type(self) -> str:
        """The quantization type that holds the most tensors, e.g. 'Q4_1'."""
        return max(self.tensors_by_type, key=lambda kind: self.tensors_by_type[kind])

    def describe(self) -> str:
        """'Q4_1 ×210, F32 ×61, Q8_0 ×1'."""
        ranked = sorted(self.tensors_by_type.items(), key=lambda item: -item[1])
        return ", ".join(f"{kind} ×{count}" for kind, count in ranked)


@dataclass(frozen=True, slots=True)
class GgufModel:
    """What a GGUF header tells the planner."""

    spec: ModelSpec
    tensors: TensorInventory


class _Metadata:
    """Typed access to the header's key/value fields under an architecture prefix."""

    def __init__(self, fields: dict[str, Any], path: Path) -> None:
        self._fields = fields
        self._path = path
        self.arch = str(self.get("general.architecture") or "")

    def get(self, key: str) -> Any:
        field = self._fields.get(key)
        if field is None:
            return None
        value = field.contents()
        return max(value) if isinstance(value, list) and value else value

    def arch_int(self, key: str, default: int | None = None) -> int:
        value = self.get(f"{self.arch}.{key}")
        if value is None:
            if default is None:
                raise PlanError(f"the GGUF header of {self._path} lacks {self.arch}.{key}")
            return default
        return int(value)

    def count(self, key: str) -> int:
        field = self._fields.get(key)
        return len(field.data) if field is not None else 0


def _spec(meta: _Metadata, tensor_names: set[str], path: Path) -> ModelSpec:
    layers = meta.arch_int("block_count")
    hidden = meta.arch_int("embedding_length")
    heads = meta.arch_int("attention.head_count")
    kv_lora_rank = meta.arch_int("attention.kv_lora_rank", 0)
    rope_dim = meta.arch_int("rope.dimension_count", 0)
    key_length = meta.arch_int("attention.key_length", hidden // heads)
    window = meta.arch_int("attention.sliding_window", 0)
    period = _SLIDING_PERIOD.get(meta.arch)
    sliding = tuple(i for i in range(layers) if (i + 1) % period) if window and period else ()
    experts = meta.arch_int("expert_count", 0)
    moe_width = meta.arch_int("expert_feed_forward_length", 0)
    vocab = meta.arch_int("vocab_size", 0) or meta.count("tokenizer.ggml.tokens")
    if not vocab:
        raise PlanError(f"the GGUF header of {path} gives no vocabulary size")
    return ModelSpec(
        name=path.stem,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=meta.arch_int("attention.head_count_kv", heads),
        head_dim=key_length,
        intermediate_size=meta.arch_int("feed_forward_length", 0),
        vocab_size=vocab,
        tie_word_embeddings="output.weight" not in tensor_names,
        max_position_embeddings=meta.arch_int("context_length"),
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        num_experts=experts,
        experts_per_token=meta.arch_int("expert_used_count", 0),
        moe_intermediate_size=moe_width,
        shared_expert_intermediate_size=meta.arch_int("expert_shared_count", 0) * moe_width,
        first_dense_layers=meta.arch_int("leading_dense_block_count", 0) if experts else 0,
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=rope_dim if kv_lora_rank else 0,
        q_lora_rank=meta.arch_int("attention.q_lora_rank", 0),
        qk_nope_head_dim=key_length - rope_dim if kv_lora_rank else 0,
        v_head_dim=meta.arch_int("attention.value_length", 0) if kv_lora_rank else 0,
        sliding_window=window if sliding else 0,
        sliding_layers=sliding,
    )


def _inventory(tensors: list[Any]) -> TensorInventory:
    return TensorInventory(
        total_bytes=sum(int(t.n_bytes) for t in tensors),
        embedding_bytes=sum(int(t.n_bytes) for t in tensors if t.name == "token_embd.weight"),
        routed_expert_bytes=sum(int(t.n_bytes) for t in tensors if "_exps." in t.name),
        tensors_by_type=dict(Counter(t.tensor_type.name for t in tensors)),
    )


def read_gguf(path: Path) -> GgufModel:
    """Read the spec and the tensor inventory of a GGUF file."""
    from gguf import GGUFReader  # imported here: only GGUF inputs pay for numpy and gguf

    try:
        reader = GGUFReader(path)
    except (OSError, ValueError, IndexError, KeyError) as error:
        raise PlanError(f"{path} is not a readable GGUF file ({error})") from None
    meta = _Metadata(reader.fields, path)
    if not meta.arch:
        raise PlanError(f"the GGUF header of {path} names no architecture")
    spec = _spec(meta, {t.name for t in reader.tensors}, path)
    return GgufModel(spec=spec, tensors=_inventory(list(reader.tensors)))
