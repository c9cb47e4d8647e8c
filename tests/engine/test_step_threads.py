"""A step's CPU threads: a q8/q4 step (or a bf16 one on AMX tiles) runs torch's own ops (the
sampler's among them) on its thread alone, its heavy work on the kernels' pool; a CUDA
step's host-side ops run on its thread alone too; a step of any other CPU path gives torch
every CPU; either way the thread's torch setting is back as it was after the step."""

from __future__ import annotations

import os

import pytest
import torch
from engine_helpers import generate, needs_kernels

from inhouse.engine.config import EngineConfig
from inhouse.engine.engine import LLMEngine
from inhouse.engine.models.loader import load_model
from inhouse.engine.sampling_params import SamplingParams


class ThreadsSeen:
    """The engine's sampler, noting torch's thread count at each call."""

    def __init__(self, sampler) -> None:
        self.sampler = sampler
        self.seen: list[int] = []

    def __call__(self, *args, **kwargs):
        self.seen.append(torch.get_num_threads())
        return self.sampler(*args, **kwargs)


def steps_threads_seen(loaded, config: EngineConfig) -> list[int]:
    """Torch's thread count at each sampler call of a short greedy request; checks that
    the caller's own setting is back after every step."""
    engine = LLMEngine(config, loaded=loaded)
    watch = engine.core.sampler = ThreadsSeen(engine.core.sampler)
    before = torch.get_num_threads()
    outside = before + 1  # a setting no step would choose, to see it come back
    torch.set_num_threads(outside)
    try:
        generate(engine, {"a": [5, 9, 200, 17]}, SamplingParams(temperature=0, max_tokens=6))
        assert torch.get_num_threads() == outside
    finally:
        torch.set_num_threads(before)
    return watch.seen


@needs_kernels
@pytest.mark.parametrize("quantization", ["q4", "q8", "none"])
def test_a_quantized_step_samples_on_one_thread_and_restores_the_setting(
    quantization, tiny_llama_folder
) -> None:
    loaded = load_model(tiny_llama_folder, quantization=quantization)
    seen = steps_threads_seen(loaded, EngineConfig(max_model_len=128, kv_cache_memory=2**20))
    on_pool = quantization in ("q4", "q8") or loaded.model.bf16_tiles  # bf16 on AMX tiles
    expected = 1 if on_pool else len(os.sched_getaffinity(0))
    assert seen and set(seen) == {expected}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_a_cuda_step_keeps_torch_host_side_on_one_thread(tiny_llama_folder) -> None:
    loaded = load_model(tiny_llama_folder, device="cuda")
    config = EngineConfig(device="cuda", max_model_len=128, kv_cache_memory=2**20)
    seen = steps_threads_seen(loaded, config)
    assert seen and set(seen) == {1}
