"""HF transformers' greedy tokens, the independent reference the engine's tokens are held to."""

from __future__ import annotations

import inspect

import torch


def _cache_kwarg() -> str:
    """transformers 5.24 calls the forward's KV-cache argument ``cache``, earlier ones
    ``past_key_values``; an unknown name would be swallowed and the cache silently dropped."""
    from transformers import LlamaForCausalLM

    params = inspect.signature(LlamaForCausalLM.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


_CACHE_KWARG = _cache_kwarg()


@torch.inference_mode()
def hf_greedy(model, prompt: list[int], new_tokens: int, **first: torch.Tensor) -> list[int]:
    """HF's forward with its own KV cache, argmax each step, no stopping at EOS; ``first``:
    more inputs of the prompt's forward (a vision model's pixel values)."""
    device = model.device
    out = model(input_ids=torch.tensor([prompt], device=device), use_cache=True, **first)
    tokens = [int(out.logits[0, -1].argmax())]
    while len(tokens) < new_tokens:
        out = model(
            input_ids=torch.tensor([[tokens[-1]]], device=device),
            **{_CACHE_KWARG: out.past_key_values},
            use_cache=True,
        )
        tokens.append(int(out.logits[0, -1].argmax()))
    return tokens
