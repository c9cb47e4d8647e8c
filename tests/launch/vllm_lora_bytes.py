"""Run with vLLM's own Python: ``vllm_lora_bytes.py FOLDER SLOTS RANK`` prints the bytes of
every LoRA stack vLLM allocates for that model (``lora_a_stacked``, ``lora_b_stacked``), one
engine in this process, no compile: what `test_vllm_lora_memory.py` checks the plan against."""

from __future__ import annotations

import sys


def lora_bytes(model) -> int:
    total = 0
    for module in model.modules():
        for name in ("lora_a_stacked", "lora_b_stacked"):
            stacked = getattr(module, name, None)
            if stacked is not None:
                tensors = stacked if isinstance(stacked, tuple | list) else (stacked,)
                total += sum(t.nbytes for t in tensors)
    return total


if __name__ == "__main__":
    from vllm import LLM

    folder, slots, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    llm = LLM(
        model=folder, enable_lora=True, max_loras=slots, max_lora_rank=rank, dtype="bfloat16",
        max_model_len=256, kv_cache_memory_bytes=2**28, enforce_eager=True,
    )  # fmt: skip
    print("LORA_BYTES", *llm.apply_model(lora_bytes))
