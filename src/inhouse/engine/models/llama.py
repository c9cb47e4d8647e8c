"""One decoder covering Llama 2/3, SmolLM2, Mistral, Qwen2/2.5 and Qwen3, read from the HF config.

Differences are config switches: Qwen2 puts a bias on q/k/v, Qwen3 normalises q and k
per head and may set ``head_dim`` apart from ``hidden / heads``, Llama may add biases
everywhere, small models tie ``lm_head`` to the embedding. q/k/v and gate/up are each
fused into one matmul. The forward takes a flat batch of tokens from many sequences and
reads and writes the paged KV cache through :mod:`inhouse.engine.attention`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from inhouse.engine.attention import AttentionMetadata, paged_attention, write_kv

SUPPORTED_ARCHITECTURES = frozenset(
    {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}
)

_ARCH_OF_MODEL_TYPE = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture or settings are outside what this decoder implements."""


@dataclass(frozen=True, slots=True)
class LlamaArgs:
    """The shape of the decoder, independent of where the config came from."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool

    @classmethod
    def from_hf_config(cls, config) -> LlamaArgs:
        archs = getattr(config, "architectures", None)
        arch = archs[0] if archs else _ARCH_OF_MODEL_TYPE.get(config.model_type, config.model_type)
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"architecture {arch!r} is not supported; "
                f"supported: {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        if getattr(config, "hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"activation {config.hidden_act!r} is not supported")
        heads = config.num_attention_heads
        attention_bias = bool(getattr(config, "attention_bias", False))
        is_qwen2 = arch == "Qwen2ForCausalLM"
        return cls(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            rms_norm_eps=config.rms_norm_eps,
            qkv_bias=is_qwen2 or attention_bias,
            o_bias=attention_bias and not is_qwen2,
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        )


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, as the reference implementation does."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            args.num_heads,
            args.num_kv_heads,
            args.head_dim,
        )
        self.q_size = args.num_heads * args.head_dim
        self.kv_size = args.num_kv_heads * args.head_dim
        self.scale = args.head_dim**-0.5
        self.qkv_proj = nn.Linear(
            args.hidden_size, self.q_size + 2 * self.kv_size, bias=args.qkv_bias
        )
        self.o_proj = nn.Linear(self.q_size, args.hidden_size, bias=args.o_bias)
        self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps) if args.qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        return self.o_proj(paged_attention(q, k_cache, v_cache, meta, self.scale))


class MLP(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.intermediate = args.intermediate_size
        self.gate_up_proj = nn.Linear(args.hidden_size, 2 * self.intermediate, bias=args.mlp_bias)
        self.down_proj = nn.Linear(self.intermediate, args.hidden_size, bias=args.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = Attention(args)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = MLP(args)

    def forward(self, h, cos, sin, k_cache, v_cache, meta) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, k_cache, v_cache, meta)
        return h + self.mlp(self.post_attention_layernorm(h))


# Checkpoint names of the projections we fuse: (fused name, part, index in fused tensor).
_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class LlamaForCausalLM(nn.Module):
    """Decoder over a flat token batch; returns float32 logits at the requested rows."""

    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.args = args
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(args) for _ in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope_cos = self.rope_sin = torch.empty(0)

    def init_rope(self, inv_freq: torch.Tensor, scaling: float, max_positions: int) -> None:
        """Tabulate cos/sin per position in float32, the way the HF reference computes them."""
        device = self.embed_tokens.weight.device
        positions = torch.arange(max_positions, dtype=torch.float32, device=device)
        angles = positions[:, None] * inv_freq.float().to(device)[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        self.rope_cos = angles.cos() * scaling
        self.rope_sin = angles.sin() * scaling

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: torch.Tensor,
        meta: AttentionMetadata,
        logit_rows: torch.Tensor,
    ) -> torch.Tensor:
        """Float32 logits at ``logit_rows``; ``kv_caches``: ``[layers, 2, slots, heads, dim]``."""
        h = self.embed_tokens(input_ids)
        cos = self.rope_cos[positions].to(h.dtype)[:, None, :]
        sin = self.rope_sin[positions].to(h.dtype)[:, None, :]
        for layer, cache in zip(self.layers, kv_caches, strict=True):
            h = layer(h, cos, sin, cache[0], cache[1], meta)
        h = self.norm(h[logit_rows])
        return self.lm_head(h).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named checkpoint tensors in, fusing q/k/v and gate/up; checks completeness."""
        params = dict(self.named_parameters())
        missing = {_part_key(name, part) for name in params for part in _parts_of(name)}
        for hf_name, tensor in weights:
            name = hf_name.removeprefix("model.")
            if name.startswith("rotary_emb") or (
                name == "lm_head.weight" and self.args.tie_word_embeddings
            ):
                continue
            module, _, leaf = name.rpartition(".")
            parent, _, proj = module.rpartition(".")
            if proj in _FUSED:
                fused, part = _FUSED[proj]
                name = f"{parent}.{fused}.{leaf}"
                target = _fused_part(params[name], part, self.args, fused)
            elif name in params:
                target, part = params[name].data, None
            else:
                raise UnsupportedModelError(f"unexpected checkpoint tensor {hf_name!r}")
            if target.shape != tensor.shape:
                raise UnsupportedModelError(
                    f"{hf_name}: checkpoint shape {tuple(tensor.shape)} "
                    f"!= model shape {tuple(target.shape)}"
                )
            target.copy_(tensor)
            missing.discard(_part_key(name, part))
        if missing:
            raise UnsupportedModelError(f"checkpoint lacks tensors: {sorted(missing)[:5]}")


def _parts_of(name: str) -> tuple[int | None, ...]:
    fused = name.rsplit(".", 2)[-2]
    return {"qkv_proj": (0, 1, 2), "gate_up_proj": (0, 1)}.get(fused, (None,))


def _part_key(name: str, part: int | None) -> str:
    return name if part is None else f"{name}#{part}"


def _fused_part(param: nn.Parameter, part: int, args: LlamaArgs, fused: str) -> torch.Tensor:
    if fused == "gate_up_proj":
        sizes = [args.intermediate_size] * 2
    else:
        kv = args.num_kv_heads * args.head_dim
        sizes = [args.num_heads * args.head_dim, kv, kv]
    return param.data.split(sizes, dim=0)[part]
