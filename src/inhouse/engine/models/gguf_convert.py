"""Turn a GGUF file into an HF folder (config.json, model.safetensors, tokenizer files).

Tensors are dequantized to float32 with the ``gguf`` package and renamed to the HF
layout. llama.cpp's converter permutes the rows of q/k projections of ``llama``-arch
models (to interleave rotary pairs); we undo that so the weights match HF's rotary
convention. Config and tokenizer (with chat template) are read from the GGUF metadata
by transformers.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import torch

SUPPORTED_GGUF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
# GGUF tensor name part -> HF module path within a layer (or the whole model).
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_MODEL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


class GGUFConversionError(ValueError):
    """The GGUF file holds something this converter cannot map to an HF model."""


def hf_tensor_name(gguf_name: str) -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``."""
    stem, _, leaf = gguf_name.rpartition(".")
    if stem in _MODEL_NAMES:
        return f"{_MODEL_NAMES[stem]}.{leaf}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{leaf}"
    raise GGUFConversionError(f"unknown GGUF tensor {gguf_name!r}")


def unpermute_rotary_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Invert llama.cpp's q/k row permutation (``(h, 2, d/2) -> (h, d/2, 2)`` per head)."""
    half = weight.shape[0] // num_heads // 2
    rows = weight.reshape(num_heads, half, 2, *weight.shape[1:])
    return rows.swapaxes(1, 2).reshape(weight.shape)


BLOCK_TYPES_FILE = "gguf_block_types.json"


def write_block_types(folder: Path, counts: Counter[str]) -> None:
    """Record, beside a converted folder, how many of the GGUF's tensors had each type."""
    (folder / BLOCK_TYPES_FILE).write_text(json.dumps(dict(counts)))


def main_block_type(folder: Path, source: Path) -> str:
    """The type most of the GGUF's tensors had (e.g. "Q4_1"), from the record the conversion
    wrote; a folder converted before there was one gets it now, once (parsing a GGUF header
    with ``gguf`` takes seconds: it reads the whole vocabulary)."""
    record = folder / BLOCK_TYPES_FILE
    if not record.is_file():
        # gguf (and numpy): only a first load of this GGUF file reads it.
        from gguf import GGUFReader

        write_block_types(folder, Counter(t.tensor_type.name for t in GGUFReader(source).tensors))
    counts: dict[str, int] = json.loads(record.read_text())
    return max(counts, key=lambda kind: counts[kind])


def convert_gguf(path: Path, out_dir: Path, dtype: torch.dtype = torch.float32) -> None:
    """Write the HF folder for GGUF ``path`` to ``out_dir`` atomically (a rename at the end),
    its weights in ``dtype`` (float32 keeps every dequantized value exactly)."""
    # gguf, safetensors, transformers: only a conversion needs them.
    from gguf import GGUFReader, dequantize
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoTokenizer

    reader = GGUFReader(path)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise GGUFConversionError(
            f"GGUF architecture {arch!r} is not supported; "
            f"supported: {sorted(SUPPORTED_GGUF_ARCHITECTURES)}"
        )
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    config.architectures = [SUPPORTED_GGUF_ARCHITECTURES[config.model_type]]
    if dtype != torch.float32:  # a float32 folder leaves the dtype to its loader, as before
        config.dtype = dtype
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    tensors: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        name = hf_tensor_name(t.name)
        weight = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        weight = weight.reshape(tuple(int(d) for d in reversed(t.shape)))
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            weight = unpermute_rotary_rows(weight, heads if "q_proj" in name else kv_heads)
        tensors[name] = torch.tensor(weight).to(dtype)
    tmp = out_dir.with_name(f"{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
    write_block_types(tmp, Counter(t.tensor_type.name for t in reader.tensors))
    try:
        tmp.rename(out_dir)
    except OSError:
        if not (out_dir / "model.safetensors").exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another process finished the same conversion first
