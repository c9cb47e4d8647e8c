"""Driving an LLMEngine to completion in tests, and checking it gave every block back; and
the kernels' outputs from their AVX2 build, to hold against this host's."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from inhouse.engine.config import EngineConfig
from inhouse.engine.engine import LLMEngine
from inhouse.engine.models.loader import LoadedModel
from inhouse.engine.outputs import RequestOutput
from inhouse.engine.request import EngineRequest
from inhouse.engine.sampling_params import SamplingParams

TINY_BLOCK = 4
TINY_BLOCK_BYTES = 2 * 3 * 2 * 16 * 4 * TINY_BLOCK  # K+V, 3 layers, 2 kv heads, dim 16, fp32


def tiny_engine(loaded: LoadedModel, num_blocks: int = 256, **config: object) -> LLMEngine:
    """An engine over a tiny test model with a KV cache of exactly ``num_blocks`` blocks."""
    settings = {
        "max_model_len": 128,
        "block_size": TINY_BLOCK,
        "kv_cache_memory": num_blocks * TINY_BLOCK_BYTES,
        "seed": 0,
        **config,
    }
    engine = LLMEngine(EngineConfig(**settings), loaded=loaded)
    assert engine.info.budget.num_blocks == num_blocks
    return engine


@dataclass
class Choice:
    """One choice's deltas joined up."""

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    deltas: list[str] = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class Result:
    choices: dict[int, Choice] = field(default_factory=dict)
    num_cached_tokens: int = 0
    finished: bool = False
    outputs: list[RequestOutput] = field(default_factory=list)


def absorb(results: dict[str, Result], out: RequestOutput) -> None:
    result = results.setdefault(out.request_id, Result())
    assert not result.finished, f"{out.request_id} sent output after finishing"
    result.outputs.append(out)
    result.num_cached_tokens = out.num_cached_tokens
    result.finished = out.finished
    for delta in out.outputs:
        choice = result.choices.setdefault(delta.index, Choice())
        assert choice.finish_reason is None, "a choice sent output after finishing"
        choice.token_ids += delta.token_ids
        choice.text += delta.text
        choice.deltas.append(delta.text)
        choice.logprobs += delta.logprobs or []
        choice.finish_reason = delta.finish_reason
        choice.stop_reason = delta.stop_reason


def step_into(engine: LLMEngine, results: dict[str, Result]) -> None:
    for out in engine.step():
        absorb(results, out)


def run_to_end(
    engine: LLMEngine, results: dict[str, Result] | None = None, max_steps: int = 10_000
) -> dict[str, Result]:
    """Step until every request finished; then every block must be free again."""
    results = {} if results is None else results
    for _ in range(max_steps):
        if not engine.has_unfinished():
            break
        for out in engine.step():
            absorb(results, out)
    assert not engine.has_unfinished()
    assert_all_blocks_free(engine)
    return results


def assert_all_blocks_free(engine: LLMEngine) -> None:
    pool = engine.core.kv_cache.pool
    assert pool.num_free == pool.num_blocks
    assert all(block.ref_cnt == 0 for block in pool.blocks)
    assert not engine.core.scheduler.running and not engine.core.scheduler.waiting
    assert not engine.processor.has_unfinished()


def add(
    engine: LLMEngine, request_id: str, prompt: list[int], params: SamplingParams, **kw: object
) -> None:
    """Queue one request as the server would: an EngineRequest made once."""
    engine.add_request(EngineRequest(request_id, list(prompt), params, **kw))


def greedy(max_tokens: int, **kwargs: object) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kwargs)


def generate(
    engine: LLMEngine, prompts: dict[str, list[int]], params: SamplingParams, **kwargs: object
) -> dict[str, Result]:
    for request_id, prompt in prompts.items():
        add(engine, request_id, prompt, params, **kwargs)
    return run_to_end(engine)


def _kernels_built() -> bool:
    from inhouse.engine.kernels.build import load_kernels

    return load_kernels() is not None


# The C++ kernels build wherever a C++ compiler exists; without one the eager paths run.
needs_kernels = pytest.mark.skipif(not _kernels_built(), reason="no C++ compiler for the kernels")


def avx2_build_outputs(module: str, saved: Path) -> dict[str, np.ndarray]:
    """``module.kernel_outputs()`` (a test module here returning named arrays) as the AVX2
    build gives them (``INHOUSE_KERNELS_ISA=avx2``: what an AVX2-only host runs), in a
    subprocess; skips unless this process runs an AVX-512 build (an AVX2 host runs the
    AVX2 code in process)."""
    from inhouse.engine.kernels.build import load_kernels

    built = load_kernels()
    if built is None or not built.isa.startswith("avx512"):
        pytest.skip(f"this process runs the {built and built.isa} build itself")
    script = (
        f"import sys, numpy as np, {module} as m;"
        "from inhouse.engine.kernels.build import load_kernels;"
        "assert load_kernels().isa == 'avx2';"
        "np.savez(sys.argv[1], **m.kernel_outputs())"
    )
    here = Path(__file__).parent  # the test modules, and tests/ (pytest's pythonpath)
    path = os.pathsep.join([str(here), str(here.parent), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "INHOUSE_KERNELS_ISA": "avx2", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", script, str(saved)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(saved) as outputs:
        return dict(outputs)
