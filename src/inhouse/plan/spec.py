"""ModelSpec, the architecture facts the planner needs, and its readers.

A spec comes from an HF `config.json`, a GGUF header, or the built-in catalogue.
Parameter counts are derived from the shapes (gated MLPs, as every supported
family uses); they match the published totals within a fraction of a percent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inhouse.plan.errors import PlanError


@dataclass(frozen=True, slots=True)
class ParamCounts:
    """Parameters by role: which ones quantize, which are read per token."""

    embedding: int
    lm_head: int
    attention: int
    dense_mlp: int
    routed_experts: int
    shared_experts: int
    other: int  # norms, MoE routers, biases: kept in high precision

    @property
    def linear(self) -> int:
        """Parameters in the linear layers that AWQ/GPTQ/fp8/int8 quantize."""
        return self.attention + self.dense_mlp + self.routed_experts + self.shared_experts

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.linear + self.other


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Architecture facts of a decoder-only transformer."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    attention_bias: bool = False
    # Mixture of experts: 0 experts means a dense model.
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0  # total width of the always-on experts
    first_dense_layers: int = 0  # layers whose MLP stays dense (DeepSeek first_k_dense_replace)
    # Multi-head latent attention (DeepSeek): the cache holds the latent, not K and V.
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # Sliding-window attention: these layers keep at most `sliding_window` tokens.
    sliding_window: int = 0
    sliding_layers: tuple[int, ...] = field(default=())

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def attention_kind(self) -> str:
        """MLA, MHA, MQA or GQA: how many K/V heads serve the query heads."""
        if self.is_mla:
            return "MLA"
        if self.num_key_value_heads == self.num_attention_heads:
            return "MHA"
        return "MQA" if self.num_key_value_heads == 1 else "GQA"

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    def param_counts(self) -> ParamCounts:
        """Parameters by role, derived from the shapes."""
        h, layers = self.hidden_size, self.num_layers
        gated = 3 * h  # gate, up and down projections
        embedding = self.vocab_size * h
        other = (2 * layers + 1) * h + self._attention_bias_params()
        other += self.moe_layers * self.num_experts * h  # routers
        return ParamCounts(
            embedding=embedding,
            lm_head=0 if self.tie_word_embeddings else embedding,
            attention=layers * self._attention_params_per_layer(),
            dense_mlp=(layers - self.moe_layers) * gated * self.intermediate_size,
            routed_experts=self.moe_layers * self.num_experts * gated * self.moe_intermediate_size,
            shared_experts=self.moe_layers * gated * self.shared_expert_intermediate_size,
            other=other,
        )

    @property
    def total_params(self) -> int:
        """Every parameter, counted once (tied embeddings once)."""
        return self.param_counts().total

    @property
    def active_params(self) -> int:
        """Parameters used per token: the total less the experts a token is not routed to."""
        counts = self.param_counts()
        if not self.is_moe:
            return counts.total
        inactive = counts.routed_experts * (self.num_experts - self.experts_per_token)
        return counts.total - inactive // self.num_experts

    def _attention_params_per_layer(self) -> int:
        h, heads = self.hidden_size, self.num_attention_heads
        if self.is_mla:
            qk_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (
                h * self.q_lora_rank + self.q_lora_rank * heads * qk_dim + self.q_lora_rank
                if self.q_lora_rank
                else h * heads * qk_dim
            )
            kv = (
                h * (self.kv_lora_rank + self.qk_rope_head_dim)
                + self.kv_lora_rank
                + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
            )
            return q + kv + heads * self.v_head_dim * h
        q_width = heads * self.head_dim
        kv_width = self.num_key_value_heads * self.head_dim
        return 2 * h * q_width + 2 * h * kv_width

    def _attention_bias_params(self) -> int:
        if not self.attention_bias:
            return 0
        return (
            self.num_layers
            * (self.num_attention_heads + 2 * self.num_key_value_heads)
            * (self.head_dim)
        )


def _first(config: dict[str, Any], *keys: str) -> Any:
    """The first of `keys` that the config sets to a non-null value, else None."""
    return next((config[key] for key in keys if config.get(key) is not None), None)


def _required(config: dict[str, Any], key: str, name: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        problem = "lacks" if value is None else "has an invalid"
        raise PlanError(f"the config of {name} {problem} field {key!r}, needed to plan memory")
    return value


def _sliding_layers(config: dict[str, Any], num_layers: int) -> tuple[int, ...]:
    """Which layers use the sliding window, by the conventions transformers follows."""
    if isinstance(config.get("layer_types"), list):
        return tuple(
            i for i, kind in enumerate(config["layer_types"]) if kind == "sliding_attention"
        )
    if not config.get("sliding_window") or config.get("use_sliding_window") is False:
        return ()
    model_type = config.get("model_type", "")
    if model_type == "gemma2":  # local attention on even layers, global on odd
        return tuple(range(0, num_layers, 2))
    if model_type.startswith("qwen"):  # layers from max_window_layers on slide
        return tuple(range(config.get("max_window_layers", num_layers), num_layers))
    return tuple(range(num_layers))  # Mistral v0.1: every layer slides


def _dense_layer_count(config: dict[str, Any], num_layers: int) -> int:
    if config.get("first_k_dense_replace") is not None:
        return int(config["first_k_dense_replace"])
    step = config.get("decoder_sparse_step") or 1
    dense_only = set(config.get("mlp_only_layers") or [])
    return sum(1 for i in range(num_layers) if i in dense_only or (i + 1) % step != 0)


def spec_from_hf_config(config: dict[str, Any], name: str = "model") -> ModelSpec:
    """Read a ModelSpec from a Hugging Face `config.json` dict (text part of multimodal ones)."""
    if "num_hidden_layers" not in config and isinstance(config.get("text_config"), dict):
        config = {"model_type": config.get("model_type", ""), **config["text_config"]}
    layers = _required(config, "num_hidden_layers", name)
    hidden = _required(config, "hidden_size", name)
    heads = _required(config, "num_attention_heads", name)
    experts = _first(config, "num_local_experts", "num_experts", "n_routed_experts") or 0
    intermediate = _required(config, "intermediate_size", name)
    max_positions = _first(config, "max_position_embeddings", "n_positions", "seq_length")
    if not isinstance(max_positions, int):
        raise PlanError(f"the config of {name} lacks field 'max_position_embeddings'")
    model_type = config.get("model_type", "")
    moe_width = config.get("moe_intermediate_size") or (intermediate if experts else 0)
    shared = (config.get("n_shared_experts") or 0) * moe_width or (
        config.get("shared_expert_intermediate_size") or 0
    )
    sliding = _sliding_layers(config, layers)
    mla_head_dim = (config.get("qk_nope_head_dim") or 0) + (config.get("qk_rope_head_dim") or 0)
    return ModelSpec(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or mla_head_dim or hidden // heads,
        intermediate_size=intermediate,
        vocab_size=_required(config, "vocab_size", name),
        # Absent means transformers' PretrainedConfig default, True: configs are saved as a diff.
        tie_word_embeddings=bool(config.get("tie_word_embeddings", True)),
        max_position_embeddings=max_positions,
        attention_bias=bool(config.get("attention_bias", model_type in ("qwen2", "qwen2_moe"))),
        num_experts=experts,
        experts_per_token=config.get("num_experts_per_tok") or 0 if experts else 0,
        moe_intermediate_size=moe_width,
        shared_expert_intermediate_size=shared if experts else 0,
        first_dense_layers=_dense_layer_count(config, layers) if experts else 0,
        kv_lora_rank=config.get("kv_lora_rank") or 0,
        qk_rope_head_dim=config.get("qk_rope_head_dim") or 0,
        q_lora_rank=config.get("q_lora_rank") or 0,
        qk_nope_head_dim=config.get("qk_nope_head_dim") or 0,
        v_head_dim=config.get("v_head_dim") or 0,
        sliding_window=config.get("sliding_window") or 0 if sliding else 0,
        sliding_layers=sliding,
    )


def checkpoint_format(config: dict[str, Any]) -> str:
    """The weight format a `config.json` checkpoint is stored in (bf16 unless it says otherwise)."""
    method = str((config.get("quantization_config") or {}).get("quant_method", "")).lower()
    if method in ("awq", "gptq", "fp8"):
        return method
    dtype = config.get("torch_dtype") or config.get("dtype")
    return "fp16" if dtype == "float16" else "bf16"


def read_config_json(path: Path) -> dict[str, Any]:
    """Parse a `config.json`, turning every failure into one sentence."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise PlanError(
            f"{path} is not valid JSON (line {error.lineno}, column {error.colno}: {error.msg})"
        ) from None
    except (OSError, UnicodeDecodeError) as error:
        raise PlanError(f"cannot read {path}: {error}") from None
    if not isinstance(config, dict):
        raise PlanError(f"{path} holds JSON but not a model config object")
    return config
