"""Tiny random LoRA adapters for tests, written by PEFT itself (``save_pretrained``), so the
engine reads exactly what a user's trained adapter would hold. PEFT starts ``lora_B`` at
zero; here both halves are random and large enough that every adapter changes the tokens."""

from __future__ import annotations

from pathlib import Path

import torch

from hf_reference import hf_greedy

ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def save_random_adapter(
    base,
    folder: Path,
    seed: int,
    rank: int = 8,
    alpha: int = 16,
    targets: tuple[str, ...] = ALL_PROJECTIONS,
    rslora: bool = False,
    size: float = 0.3,
) -> Path:
    """Write a PEFT LoRA adapter of ``base`` (an HF model, left unchanged) to ``folder``."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=list(targets),
        use_rslora=rslora,
        init_lora_weights=False,
    )
    peft_model = get_peft_model(base, config, adapter_name="default")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(size * torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    peft_model.save_pretrained(folder)
    peft_model.unload()  # the base's own modules back in place, for the next adapter
    return folder


def peft_greedy(base, adapter: Path, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """HF transformers + PEFT's greedy tokens with ``adapter`` on ``base`` (left unchanged),
    ``new_tokens`` each, not stopping at EOS."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(base, adapter).eval()
    try:
        return [hf_greedy(model, prompt, new_tokens) for prompt in prompts]
    finally:
        model.unload()


def bundled_adapter(
    folder: Path, seed: int, rank: int = 8, targets: tuple[str, ...] = ("q_proj", "v_proj")
) -> Path:
    """An adapter of ``targets`` for the bundled model, written on a random Llama of its
    shapes (read from its GGUF header; without an MLP target, the MLP shrunk to nothing and a
    tiny vocabulary): quick to build, and only those shapes matter to it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from inhouse.manifests.bundled import default_chat_model
    from inhouse.plan.gguf_header import read_gguf

    spec = read_gguf(default_chat_model()).spec
    mlp = any(t in targets for t in ("gate_proj", "up_proj", "down_proj"))
    config = LlamaConfig(
        hidden_size=spec.hidden_size, num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_attention_heads, num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim, intermediate_size=spec.intermediate_size if mlp else 8,
        vocab_size=8,
    )  # fmt: skip
    return save_random_adapter(
        LlamaForCausalLM(config), folder, seed, rank, 4 * rank, targets, size=1.0
    )
