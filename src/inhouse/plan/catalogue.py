"""Facts about well-known architectures, copied from each model's published config.json.

Each entry names its source. Only architecture facts live here; parameter counts
are derived by ModelSpec and tested against the published totals.
"""

from __future__ import annotations

from inhouse.plan.errors import PlanError
from inhouse.plan.spec import ModelSpec

_CATALOGUE: tuple[ModelSpec, ...] = (
    # https://huggingface.co/HuggingFaceTB/SmolLM2-135M/blob/main/config.json
    ModelSpec(
        name="SmolLM2-135M",
        num_layers=30,
        hidden_size=576,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        intermediate_size=1536,
        vocab_size=49152,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
    ),
    # https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json
    ModelSpec(
        name="Llama-3.1-8B",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=128256,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
    ),
    # https://huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json
    ModelSpec(
        name="Llama-3.1-70B",
        num_layers=80,
        hidden_size=8192,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=28672,
        vocab_size=128256,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
    ),
    # https://huggingface.co/meta-llama/Llama-2-70b-hf/blob/main/config.json
    ModelSpec(
        name="Llama-2-70B",
        num_layers=80,
        hidden_size=8192,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=28672,
        vocab_size=32000,
        tie_word_embeddings=False,
        max_position_embeddings=4096,
    ),
    # https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json
    # (sliding_window 4096 on every layer)
    ModelSpec(
        name="Mistral-7B-v0.1",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=32000,
        tie_word_embeddings=False,
        max_position_embeddings=32768,
        sliding_window=4096,
        sliding_layers=tuple(range(32)),
    ),
    # https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json
    # (num_local_experts 8, num_experts_per_tok 2, sliding_window null)
    ModelSpec(
        name="Mixtral-8x7B-v0.1",
        num_layers=32,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=32000,
        tie_word_embeddings=False,
        max_position_embeddings=32768,
        num_experts=8,
        experts_per_token=2,
        moe_intermediate_size=14336,
    ),
    # https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json
    # (q/k/v biases; use_sliding_window false)
    ModelSpec(
        name="Qwen2.5-7B",
        num_layers=28,
        hidden_size=3584,
        num_attention_heads=28,
        num_key_value_heads=4,
        head_dim=128,
        intermediate_size=18944,
        vocab_size=152064,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
        attention_bias=True,
    ),
    # https://huggingface.co/Qwen/Qwen2.5-72B/blob/main/config.json
    ModelSpec(
        name="Qwen2.5-72B",
        num_layers=80,
        hidden_size=8192,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=29568,
        vocab_size=152064,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
        attention_bias=True,
    ),
    # https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json
    ModelSpec(
        name="Qwen3-8B",
        num_layers=36,
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=12288,
        vocab_size=151936,
        tie_word_embeddings=False,
        max_position_embeddings=40960,
    ),
    # https://huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json
    # (head_dim 128 although hidden/heads is 64; 128 experts, 8 per token)
    ModelSpec(
        name="Qwen3-30B-A3B",
        num_layers=48,
        hidden_size=2048,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        intermediate_size=6144,
        vocab_size=151936,
        tie_word_embeddings=False,
        max_position_embeddings=40960,
        num_experts=128,
        experts_per_token=8,
        moe_intermediate_size=768,
    ),
    # https://huggingface.co/google/gemma-2-9b/blob/main/config.json
    # (head_dim 256 although hidden/heads is 224; sliding_window 4096 on even layers;
    # tie_word_embeddings absent, i.e. the default true)
    ModelSpec(
        name="Gemma-2-9B",
        num_layers=42,
        hidden_size=3584,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=256,
        intermediate_size=14336,
        vocab_size=256000,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
        sliding_window=4096,
        sliding_layers=tuple(range(0, 42, 2)),
    ),
    # https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json
    # (MLA: kv_lora_rank 512 + qk_rope_head_dim 64; 256 routed + 1 shared expert,
    # 8 per token; first_k_dense_replace 3; the MTP layer is not served, so not counted)
    ModelSpec(
        name="DeepSeek-V3",
        num_layers=61,
        hidden_size=7168,
        num_attention_heads=128,
        num_key_value_heads=128,
        head_dim=192,
        intermediate_size=18432,
        vocab_size=129280,
        tie_word_embeddings=False,
        max_position_embeddings=163840,
        num_experts=256,
        experts_per_token=8,
        moe_intermediate_size=2048,
        shared_expert_intermediate_size=2048,
        first_dense_layers=3,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        q_lora_rank=1536,
        qk_nope_head_dim=128,
        v_head_dim=128,
    ),
)

# Formats the published checkpoints ship in, where not bf16 (config.json quantization_config).
_CHECKPOINT_FORMAT = {"DeepSeek-V3": "fp8"}

# Short names people type, mapped to the catalogue's names.
_ALIASES = {
    "smollm2": "SmolLM2-135M",
    "smollm2-135m-instruct": "SmolLM2-135M",
    "llama-3-8b": "Llama-3.1-8B",
    "llama-3-70b": "Llama-3.1-70B",
    "mistral-7b": "Mistral-7B-v0.1",
    "mixtral-8x7b": "Mixtral-8x7B-v0.1",
    "deepseek-r1": "DeepSeek-V3",
}


def catalogue_names() -> list[str]:
    """Names of the built-in architectures."""
    return [spec.name for spec in _CATALOGUE]


def find_in_catalogue(name: str) -> ModelSpec | None:
    """The catalogue entry for `name` (case-insensitive, aliases allowed), or None."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key).lower()
    return next((spec for spec in _CATALOGUE if spec.name.lower() == key), None)


def checkpoint_format_of(spec: ModelSpec) -> str:
    """The weight format a catalogue model's published checkpoint uses."""
    return _CHECKPOINT_FORMAT.get(spec.name, "bf16")


def catalogue_spec(name: str) -> ModelSpec:
    """The catalogue entry for `name`; a PlanError naming the known ones otherwise."""
    spec = find_in_catalogue(name)
    if spec is None:
        known = ", ".join(catalogue_names())
        raise PlanError(f"unknown model {name!r}: not a file and not in the catalogue ({known})")
    return spec
