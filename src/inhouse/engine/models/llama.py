"""One decoder covering Llama 2/3, SmolLM2, Mistral, Qwen2/2.5 and Qwen3, read from the HF config.

Differences are config switches: Qwen2 puts a bias on q/k/v, Qwen3 normalises q and k
per head and may set ``head_dim`` apart from ``hidden / heads``, Llama may add biases
everywhere, small models tie ``lm_head`` to the embedding. q/k/v and gate/up are each
fused into one matmul. The forward takes a flat batch of tokens from many sequences and
reads and writes the paged KV cache through :mod:`inhouse.engine.attention`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from inhouse.engine.attention import AttentionMetadata, paged_attention, write_kv
from inhouse.engine.kernels import quant
from inhouse.engine.models.row_blocks import blocked_linear, invariant_row_blocks
from inhouse.engine.step_interrupt import StepAbandoned, StepInterrupt

if TYPE_CHECKING:
    from inhouse.engine.lora.stack import AdapterRows, LoraStack

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
    sliding_window: int | None = None  # positions a sliding layer looks back, itself included
    sliding_layers: frozenset[int] = frozenset()

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
        window, sliding = _sliding_layers(config)
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
            sliding_window=window,
            sliding_layers=sliding,
        )


def _sliding_layers(config) -> tuple[int | None, frozenset[int]]:
    """The window and the layers that use it: ``layer_types`` where the config has it
    (Qwen2/3 with ``use_sliding_window``), else every layer once ``sliding_window`` is set
    (Mistral)."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is not None:
        layers = frozenset(i for i, t in enumerate(types) if t == "sliding_attention")
    else:
        layers = frozenset(range(config.num_hidden_layers)) if window else frozenset()
    return (window, layers) if layers and window else (None, frozenset())


def _empty(*shape: int, like: dict) -> nn.Parameter:
    """An uninitialised parameter: checkpoints always overwrite it, and untouched pages
    of a fresh allocation cost no memory until the weights are copied in."""
    return nn.Parameter(torch.empty(*shape, **like), requires_grad=False)


class Linear(nn.Module):
    """``x @ W.T (+ b)`` with parameters created in place, no random init.

    After :meth:`pack_fp16` the weight lives as fbgemm's packed float16 matrix and the
    product runs in float32 on it: half the bytes per weight of float32, with AVX2
    kernels. After :meth:`quantize` it lives in 32-weight blocks of int8 or 4-bit codes
    (see :mod:`inhouse.engine.kernels.quant`) multiplied by our C++ kernels. The bytes a
    decode step streams are what decide its speed on a CPU. After :meth:`pack_bf16_tiles`
    (bf16 on an AMX or AVX-512 BF16 CPU) it lives in the AMX tiles' layout and every row
    count runs on the tiles, or on ``vdpbf16ps`` chains, the same way
    (``bf16_linear.cpp``). Elsewhere, with ``row_blocks`` set (bf16 on CPU, see
    :mod:`inhouse.engine.models.row_blocks`) rows are multiplied in blocks of those
    checked sizes only. Either way each row's bits do not depend on the batch.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, like: dict) -> None:
        super().__init__()
        self.weight = _empty(out_features, in_features, like=like)
        self.bias = _empty(out_features, like=like) if bias else None
        self.packed: torch.ScriptObject | None = None
        self.quantized: quant.QuantizedWeight | None = None
        self.tiles: torch.Tensor | None = None  # bf16, packed for the AMX tiles
        self.row_blocks: tuple[int, ...] = ()  # (): all rows in one product
        self.lora: LoraStack | None = None  # adapters' low-rank pairs by slot (engine.lora)

    def pack_fp16(self, keep_weight: bool = False) -> None:
        """Pack the weight for float16-weight float32-compute products (CPU, fbgemm)."""
        bias = None if self.bias is None else self.bias.float()
        self.packed = torch.ops.quantized.linear_prepack_fp16(self.weight.float(), bias)
        if not keep_weight:
            self.weight = None

    def quantize(self, kind: str) -> None:
        """Hold the weight in block format ``kind`` ("q8" or "q4") for the C++ kernels."""
        self.quantized = quant.quantize(self.weight.data, kind)
        if self.bias is not None:
            self.bias = nn.Parameter(self.bias.data.float(), requires_grad=False)
        self.weight = None

    def pack_bf16_tiles(self, keep_weight: bool = False) -> None:
        """Hold the bf16 weight in the AMX tiles' layout (``pack_bf16``), which the
        ``vdpbf16ps`` chains read too."""
        self.tiles = torch.ops.inhouse_cpu.pack_bf16(self.weight.data)
        if not keep_weight:
            self.weight = None

    def forward(
        self,
        x: torch.Tensor,
        prompt_rows: torch.Tensor | None = None,
        adapters: AdapterRows | None = None,
    ) -> torch.Tensor:
        """``x @ W.T (+ bias)``, plus each adapter's low-rank product on its ``adapters``
        rows; a quantized weight runs the rows ``prompt_rows`` marks (a prompt's own) on AMX
        bf16 tiles where the host has them (``prompt_linear.cpp``)."""
        out = self._base(x, prompt_rows)
        if adapters is not None and self.lora is not None:
            self.lora.add_to(out, x, adapters)
        return out

    def _base(self, x: torch.Tensor, prompt_rows: torch.Tensor | None) -> torch.Tensor:
        if self.quantized is not None:
            return quant.linear(x, self.quantized, self.bias, prompt_rows)
        if self.tiles is not None:
            return torch.ops.inhouse_cpu.linear_bf16(x, self.tiles, self.bias)
        if self.packed is not None:
            return torch.ops.quantized.linear_dynamic_fp16(x, self.packed)
        if self.row_blocks:
            return blocked_linear(x, self.weight, self.bias, self.row_blocks)
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    """Root-mean-square norm, rounded exactly as the HF reference rounds it.

    HF normalises in float32, casts back, then scales by the weight in the model dtype;
    in float32 the fused kernel gives the same bits, in 16-bit the scale stays outside.
    """

    def __init__(self, dim: int, eps: float, like: dict) -> None:
        super().__init__()
        self.weight = _empty(dim, like=like)
        self.shape = (dim,)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.shape, self.weight, self.eps)
        return self.weight * F.rms_norm(x.float(), self.shape, None, self.eps).to(x.dtype)

    def add_and_norm(self, residual: torch.Tensor, delta: torch.Tensor | None) -> torch.Tensor:
        """``residual += delta`` in place, then this norm of it, in one C++ pass (float32 or
        bfloat16, rounded as :meth:`forward` rounds)."""
        return torch.ops.inhouse_cpu.add_rms_norm(residual, delta, self.weight, self.eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, args: LlamaArgs, like: dict, weights: dict, sliding: bool) -> None:
        super().__init__()
        self.sliding = sliding
        self.num_heads, self.num_kv_heads = args.num_heads, args.num_kv_heads
        self.head_dim = args.head_dim
        self.scale = args.head_dim**-0.5
        q_size, kv_size = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
        self.qkv_proj = Linear(args.hidden_size, q_size + 2 * kv_size, args.qkv_bias, weights)
        self.o_proj = Linear(q_size, args.hidden_size, args.o_bias, weights)
        self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps, like) if args.qk_norm else None
        self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps, like) if args.qk_norm else None
        self.fused = False  # rotary + K/V write by the C++ kernel (see fuse_cpu_ops)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        heads, kv_heads = self.num_heads, self.num_kv_heads
        prompt, adapters = _prompt_rows(meta), meta.adapters
        qkv = self.qkv_proj(x, prompt, adapters).view(-1, heads + 2 * kv_heads, self.head_dim)
        if self.fused:
            cos, sin = cos.view(-1, self.head_dim), sin.view(-1, self.head_dim)
            q = torch.ops.inhouse_cpu.rope_write_kv(
                qkv, cos, sin, k_cache, v_cache, meta.slot_mapping, heads
            )
            attended = paged_attention(q, k_cache, v_cache, meta, self.scale, self.sliding)
            return self.o_proj(attended, prompt, adapters)
        qk, v = qkv[:, : heads + kv_heads], qkv[:, heads + kv_heads :]
        if self.q_norm is not None:
            qk = torch.cat((self.q_norm(qk[:, :heads]), self.k_norm(qk[:, heads:])), dim=1)
        qk = _rotate(qk, cos, sin)  # q and k heads rotated in one go
        q, k = qk[:, :heads], qk[:, heads:]
        write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
        attended = paged_attention(q, k_cache, v_cache, meta, self.scale, self.sliding)
        return self.o_proj(attended, prompt, adapters)


class MLP(nn.Module):
    def __init__(self, args: LlamaArgs, weights: dict) -> None:
        super().__init__()
        self.intermediate = args.intermediate_size
        self.gate_up_proj = Linear(args.hidden_size, 2 * self.intermediate, args.mlp_bias, weights)
        self.down_proj = Linear(self.intermediate, args.hidden_size, args.mlp_bias, weights)
        self.fused = False  # silu(gate) * up by the C++ kernel (see fuse_cpu_ops)

    def forward(self, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        prompt_rows, adapters = _prompt_rows(meta), meta.adapters
        gate_up = self.gate_up_proj(x, prompt_rows, adapters)
        if self.fused:
            return self.down_proj(torch.ops.inhouse_cpu.silu_mul(gate_up), prompt_rows, adapters)
        gate, up = gate_up.split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up, prompt_rows, adapters)


class DecoderLayer(nn.Module):
    def __init__(self, args: LlamaArgs, like: dict, weights: dict, sliding: bool) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, like)
        self.self_attn = Attention(args, like, weights, sliding)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps, like)
        self.mlp = MLP(args, weights)

    def forward(self, h, cos, sin, k_cache, v_cache, meta) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, k_cache, v_cache, meta)
        return h + self.mlp(self.post_attention_layernorm(h), meta)

    def fused(self, residual, delta, cos, sin, k_cache, v_cache, meta) -> torch.Tensor:
        """The same layer with each residual add fused into the norm after it: adds the
        previous layer's MLP output ``delta`` into ``residual`` (in place) and returns
        this layer's MLP output, for the next layer (or the final norm) to add."""
        x = self.input_layernorm.add_and_norm(residual, delta)
        attended = self.self_attn(x, cos, sin, k_cache, v_cache, meta)
        normed = self.post_attention_layernorm.add_and_norm(residual, attended)
        return self.mlp(normed, meta)


# Checkpoint names of the projections we fuse: (fused name, part, index in fused tensor).
_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class LlamaForCausalLM(nn.Module):
    """Decoder over a flat token batch; returns float32 logits at the requested rows.

    Parameters start uninitialised on ``device``: projections and the embedding in
    ``weight_dtype`` (default ``dtype``), norms in ``dtype``, the dtype activations and
    the KV cache use; the loader fills them. Rotary tables are float32
    ``[max_positions, head_dim]``, computed as HF computes them.
    """

    def __init__(
        self,
        args: LlamaArgs,
        dtype: torch.dtype,
        device: torch.device,
        inv_freq: torch.Tensor,
        rope_scaling: float,
        max_positions: int,
        weight_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        like = {"dtype": dtype, "device": device}
        weights = {"dtype": weight_dtype or dtype, "device": device}
        self.args = args
        self.dtype = dtype
        self.embed_tokens = Linear(args.hidden_size, args.vocab_size, False, weights)
        self.layers = nn.ModuleList(
            DecoderLayer(args, like, weights, i in args.sliding_layers)
            for i in range(args.num_layers)
        )
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps, like)
        self.fused_norms = False  # residual adds fused into the norms (see fuse_cpu_ops)
        self.decode_weights: list[torch.Tensor | None] | None = None  # see fuse_cpu_ops
        self.bf16_tiles = False  # projections in the tiles' layout (see pack_bf16_tiles)
        self.lora_weights: list[torch.Tensor] = []  # adapter stacks, decode_layers' order
        self.checkpoint_prefix = "model."  # its tensors' prefix; a VLM's: "model.text_model."
        self.lm_head = (
            self.embed_tokens
            if args.tie_word_embeddings
            else Linear(args.hidden_size, args.vocab_size, False, weights)
        )
        positions = torch.arange(max_positions, dtype=torch.float32, device=device)
        angles = positions[:, None] * inv_freq.float().to(device)[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        self.rope_cos = angles.cos() * rope_scaling
        self.rope_sin = angles.sin() * rope_scaling

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: torch.Tensor,
        meta: AttentionMetadata,
        logit_rows: torch.Tensor | None,
        image_rows: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Float32 logits at ``logit_rows`` (None: every row); ``kv_caches``: ``[layers, 2,
        slots, heads, dim]``; ``image_rows``: rows whose embeddings an image encoder's
        output replaces, and that output."""
        h = self._embed(input_ids)
        if image_rows is not None:
            h[image_rows[0]] = image_rows[1].to(h.dtype)
        cos = self.rope_cos[positions].to(h.dtype)[:, None, :]
        sin = self.rope_sin[positions].to(h.dtype)[:, None, :]
        interrupt = meta.interrupt
        if self.decode_weights is not None and _plain_decode(meta):
            delta = self._decode_layers(h, cos, sin, kv_caches, meta)
            if delta.numel() == 0:
                raise StepAbandoned
            h = self.norm(_pick(h, logit_rows) + _pick(delta, logit_rows))
        elif self.fused_norms:
            delta = None
            for layer, cache in zip(self.layers, kv_caches, strict=True):
                _check(interrupt)
                delta = layer.fused(h, delta, cos, sin, cache[0], cache[1], meta)
            h = self.norm(_pick(h, logit_rows) + _pick(delta, logit_rows))
        else:
            for layer, cache in zip(self.layers, kv_caches, strict=True):
                _check(interrupt)
                h = layer(h, cos, sin, cache[0], cache[1], meta)
            h = self.norm(_pick(h, logit_rows))
        return self.lm_head(h).float()

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The tokens' embedding rows; a table held only in blocks (a tied q8 LM head) gives
        its dequantized rows, the numbers the LM head multiplies by."""
        table = self.embed_tokens
        if table.weight is not None:
            return F.embedding(input_ids, table.weight).to(self.dtype)
        assert table.quantized is not None
        return quant.dequantize_rows(table.quantized, input_ids)

    def _decode_layers(self, h, cos, sin, kv_caches, meta) -> torch.Tensor:
        """Every layer of a step of single-token decodes in one C++ call (``decode_layers``):
        the same kernels in the same order as :meth:`DecoderLayer.fused`, so the same bits."""
        d = meta.rows
        assert d is not None and self.decode_weights is not None
        head_dim = self.args.head_dim
        windows = [meta.sliding_window if layer.self_attn.sliding else 0 for layer in self.layers]
        return torch.ops.inhouse_cpu.decode_layers(
            h,
            None,
            cos.view(-1, head_dim),
            sin.view(-1, head_dim),
            kv_caches,
            meta.slot_mapping,
            d.block_tables,
            d.row_seq,
            d.context_lens,
            d.block_size,
            self.args.num_heads,
            head_dim**-0.5,
            windows,
            self.args.rms_norm_eps,
            self.decode_weights,
            None if meta.adapters is None else meta.adapters.row_slots,
            self.lora_weights if meta.adapters is not None else [],
            None if meta.interrupt is None else meta.interrupt.flag,
        )

    def packer(self, quantization: str) -> Callable[[str], None]:
        """A loader callback that packs each projection as soon as the last of its
        checkpoint parts is in, so loading never holds every projection twice:
        "fp16" by :meth:`Linear.pack_fp16`, "q8"/"q4" by :meth:`Linear.quantize` (the
        embedding/LM head always q8; a projection that is not whole 8-row tiles of 32-weight
        groups stays as loaded). A tied embedding keeps its float table for lookups only beside
        fp16 (packed weights cannot give rows back); in blocks it looks rows up there."""
        waiting: dict[str, set[str]] = {}
        for key in self.weight_keys():
            waiting.setdefault(_module_of(key), set()).add(key)
        modules = dict(self.named_modules())

        def loaded(key: str) -> None:
            name = _module_of(key)
            parts, module = waiting[name], modules[name]
            parts.discard(key)
            if parts or not isinstance(module, Linear):
                return
            embedding = module is self.embed_tokens
            if embedding and not self.args.tie_word_embeddings:
                return
            if quantization == "fp16":
                module.pack_fp16(keep_weight=embedding)
            elif quant.quantizable(*module.weight.shape):
                head = module is self.lm_head
                module.quantize("q8" if head else quantization)

        return loaded

    def fuse_cpu_ops(self) -> None:
        """Run rotary + K/V write, SwiGLU's product and each residual add + RMSNorm through
        the C++ kernels (float32 on CPU, kernels loaded). Qwen3's per-head q/k norm sits
        between projection and rotary, so its attention keeps the eager ops."""
        for layer in self.layers:
            layer.self_attn.fused = layer.self_attn.q_norm is None
            layer.mlp.fused = True
        self.fused_norms = True
        self.decode_weights = _decode_weights(self.layers)

    def fuse_bf16_ops(self) -> None:
        """Run rotary + K/V write and each residual add + RMSNorm through the C++ kernels in
        bfloat16, rounded where the eager modules round (kernels loaded; Qwen3's per-head q/k
        norm keeps its attention eager, as in :meth:`fuse_cpu_ops`). SwiGLU stays eager:
        torch's bf16 silu is faster than the float kernel's exact e^x."""
        for layer in self.layers:
            layer.self_attn.fused = layer.self_attn.q_norm is None
        self.fused_norms = True

    def pack_bf16_tiles(self) -> int:
        """Put every bf16 projection whose shape fits the tiles (out a multiple of 16, in of
        32) in their layout, the embedding keeping its table for lookups; returns how many."""
        packed = 0
        for module in self.modules():
            if module is self.embed_tokens and module is not self.lm_head:
                continue  # looked up only
            if isinstance(module, Linear) and module.weight is not None:
                out_features, in_features = module.weight.shape
                if out_features % 16 == 0 and in_features % 32 == 0:
                    module.pack_bf16_tiles(keep_weight=module is self.embed_tokens)
                    packed += 1
        self.bf16_tiles = packed > 0
        return packed

    def block_rows(self) -> dict[tuple[int, ...], tuple[int, ...]]:
        """Give every float projection off the tiles the row counts this CPU keeps invariant
        for its shape (probed once per shape, see :func:`invariant_row_blocks`); returns them
        by shape."""
        blocks: dict[tuple[int, ...], tuple[int, ...]] = {}
        for module in self.modules():
            if isinstance(module, Linear) and module.weight is not None and module.tiles is None:
                shape = (*module.weight.shape, module.bias is not None)
                if shape not in blocks:
                    blocks[shape] = invariant_row_blocks(module.weight, module.bias)
                module.row_blocks = blocks[shape]
        return blocks

    def weight_keys(self) -> set[str]:
        """Keys :meth:`weight_target` hands out; a complete checkpoint covers all of them."""
        return {
            _part_key(name, part) for name, _ in self.named_parameters() for part in _parts_of(name)
        }

    def weight_target(self, hf_name: str) -> tuple[str, torch.Tensor] | None:
        """``(key, tensor to fill)`` for an HF-named checkpoint tensor; None if it is not needed.

        q/k/v and gate/up land in their slice of the fused projection. A vision-language
        checkpoint's other towers (``model.vision_model.*``) are not the decoder's.
        """
        name = hf_name.removeprefix(self.checkpoint_prefix)
        if (
            name.startswith("model.")
            or name.startswith("rotary_emb")
            or (name == "lm_head.weight" and self.args.tie_word_embeddings)
        ):
            return None
        module, _, leaf = name.rpartition(".")
        parent, _, proj = module.rpartition(".")
        if proj in _FUSED:
            fused, part = _FUSED[proj]
            name = f"{parent}.{fused}.{leaf}"
            if (param := self._parameter(name)) is not None:
                return _part_key(name, part), _fused_part(param, part, self.args, fused)
        elif (param := self._parameter(name)) is not None:
            return name, param.data
        raise UnsupportedModelError(f"unexpected checkpoint tensor {hf_name!r}")

    def _parameter(self, name: str) -> nn.Parameter | None:
        """The parameter at dotted ``name``; None if there is none (or it was packed away)."""
        try:
            return self.get_parameter(name)
        except AttributeError:
            return None


def _pick(h: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """``h``'s rows at ``rows``; all of them, uncopied, for None."""
    return h if rows is None else h[rows]


def _check(interrupt: StepInterrupt | None) -> None:
    """Raise StepAbandoned before the next layer if the step was asked to stop."""
    if interrupt is not None and interrupt.stopped:
        raise StepAbandoned


def _prompt_rows(meta: AttentionMetadata) -> torch.Tensor | None:
    """The step's rows at a prompt's own positions, where the kernels take them apart."""
    return meta.rows.prompt_rows if meta.rows is not None else None


def _plain_decode(meta: AttentionMetadata) -> bool:
    """Whether every entry of the step is one new token (or one and a speculative draft),
    none of them a prompt's, for the C++ decode kernel."""
    rows = meta.rows
    plain = rows is not None and (rows.row_seq is None or rows.decode)
    return plain and rows.prompt_rows is None


def _decode_weights(layers: nn.ModuleList) -> list[torch.Tensor | None] | None:
    """The layers' weights in ``decode_layers``' order, or None when a layer cannot run there
    (a projection left unquantized, or per-head q/k norms that the fused attention skips)."""
    weights: list[torch.Tensor | None] = []
    for layer in layers:
        attention, mlp = layer.self_attn, layer.mlp
        projections = (attention.qkv_proj, attention.o_proj, mlp.gate_up_proj, mlp.down_proj)
        if not attention.fused or any(p.quantized is None for p in projections):
            return None
        parts = [(p.quantized.q, p.quantized.scales, p.quantized.mins, p.bias) for p in projections]
        weights += [layer.input_layernorm.weight, *parts[0], *parts[1]]
        weights += [layer.post_attention_layernorm.weight, *parts[2], *parts[3]]
    return weights


def _parts_of(name: str) -> tuple[int | None, ...]:
    fused = name.rsplit(".", 2)[-2]
    return {"qkv_proj": (0, 1, 2), "gate_up_proj": (0, 1)}.get(fused, (None,))


def _module_of(key: str) -> str:
    """The module a weight key (``layers.0.mlp.gate_up_proj.weight#1``) belongs to."""
    return key.partition("#")[0].rpartition(".")[0]


def _part_key(name: str, part: int | None) -> str:
    return name if part is None else f"{name}#{part}"


def _fused_part(param: nn.Parameter, part: int, args: LlamaArgs, fused: str) -> torch.Tensor:
    if fused == "gate_up_proj":
        sizes = [args.intermediate_size] * 2
    else:
        kv = args.num_kv_heads * args.head_dim
        sizes = [args.num_heads * args.head_dim, kv, kv]
    return param.data.split(sizes, dim=0)[part]
