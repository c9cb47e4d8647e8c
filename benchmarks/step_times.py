"""Median engine step times for one CPU path, to compare two commits (or two paths) run
alternately on the same host: a decode step at c=1 and c=16, and a 1500-token prefill.

Medians of ~90 decode steps and the best of three prefills shrug off a noisy VM better
than tok/s over one run. No server, no HF: the engine alone, as ``engine_throughput.py``
drives it.

    .venv/bin/python benchmarks/step_times.py [--dtype auto] [--quantization auto]
    # two commits, alternately, e.g.:
    for i in 1 2 3; do for t in A B; do PYTHONPATH=$t/src .venv/bin/python \\
        benchmarks/step_times.py --dtype bfloat16 --quantization none; done; done
"""

from __future__ import annotations

import argparse
import statistics
import time

from engine_throughput import chat_prompts
from inhouse.engine.config import EngineConfig
from inhouse.engine.engine import LLMEngine
from inhouse.engine.models.loader import LoadedModel, load_model
from inhouse.engine.request import EngineRequest
from inhouse.engine.sampling_params import SamplingParams

PREFILL_TOKENS = 1500


def step_seconds(
    config: EngineConfig, loaded: LoadedModel, prompts: list[list[int]], new_tokens: int
) -> list[float]:
    """Run the prompts together to the end on a fresh engine (nothing in its prefix cache);
    the wall time of every step."""
    engine = LLMEngine(config, loaded=loaded)
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    for i, ids in enumerate(prompts):
        engine.add_request(EngineRequest(f"r{i}", ids, params))
    steps = []
    while engine.has_unfinished():
        start = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - start)
    return steps


def long_prompt(loaded: LoadedModel) -> list[int]:
    text = " ".join(["The quick brown fox jumps over the lazy dog."] * 150)
    return loaded.tokenizer(text)["input_ids"][:PREFILL_TOKENS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--quantization", default="auto")
    args = parser.parse_args()
    loaded = load_model(None, dtype=args.dtype, quantization=args.quantization)
    config = EngineConfig(dtype=args.dtype, quantization=args.quantization, max_num_seqs=16)
    parts = []
    for c in (1, 16):
        prompts = chat_prompts(loaded, c)
        step_seconds(config, loaded, prompts, 4)  # warm-up
        decode = step_seconds(config, loaded, prompts, 96)[5:]  # past the prefill
        parts.append(f"c={c} decode step {statistics.median(decode) * 1e3:.1f} ms")
    prompt = long_prompt(loaded)
    prefill = min(sum(step_seconds(config, loaded, [prompt], 1)) for _ in range(3))
    parts.append(f"prefill {len(prompt)} tokens {prefill * 1e3:.0f} ms")
    print(f"{loaded.dtype} {loaded.quantization}: " + " | ".join(parts))


if __name__ == "__main__":
    main()
