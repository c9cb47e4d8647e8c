"""Random LoRA adapters in PEFT's format (`adapter_config.json` +
`adapter_model.safetensors`) for the bundled model, built here with PEFT, never downloaded:
on a random Llama with the bundled model's attention shapes (read from its GGUF header) and
an MLP shrunk to nothing, since the adapter touches only `q_proj` and `v_proj`. Both of its
factors are random (`init_lora_weights=False`) and scaled up, so it changes the answers."""

from __future__ import annotations

from pathlib import Path

from inhouse.manifests.bundled import default_chat_model
from inhouse.plan.gguf_header import read_gguf


def bundled_adapter(folder: Path, seed: int, rank: int = 8) -> Path:
    """Write an adapter for the bundled model into `folder`; the folder."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = read_gguf(default_chat_model()).spec
    config = LlamaConfig(
        hidden_size=spec.hidden_size, num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_attention_heads, num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim, intermediate_size=8, vocab_size=8,
    )  # fmt: skip
    torch.manual_seed(seed)
    lora = LoraConfig(
        r=rank, lora_alpha=4 * rank, target_modules=["q_proj", "v_proj"],
        init_lora_weights=False, task_type="CAUSAL_LM",
    )  # fmt: skip
    get_peft_model(LlamaForCausalLM(config), lora).save_pretrained(folder)
    return folder
