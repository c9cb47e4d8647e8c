"""Engine throughput against HF transformers ``generate`` on the same weights, same dtype, same run.

For each concurrency c, c chat prompts arrive together and each generates ``--new-tokens``
tokens greedily with ignore_eos. The engine (continuous batching over the paged KV cache)
reports aggregate output tok/s, mean TTFT and mean TPOT (vLLM's: (E2E - TTFT) / (n - 1));
HF runs the same prompts sequentially for c=1 and as one left-padded static batch for
c>1. The engine half runs first, so its peak RSS is measured before HF loads anything.
``--quantization`` is the engine's weight format (auto: fp16 weights where dtype auto gives
float32 on a CPU); HF always runs the plain weights in the resolved dtype.

    .venv/bin/python benchmarks/engine_throughput.py [--concurrency 1,4,16] [--new-tokens 128]
        [--quantization auto|none|fp16]
"""

from __future__ import annotations

import argparse
import resource
import time
from dataclasses import dataclass

import torch

from inhouse.engine.config import EngineConfig
from inhouse.engine.engine import LLMEngine
from inhouse.engine.models.loader import LoadedModel, load_model
from inhouse.engine.request import EngineRequest
from inhouse.engine.sampling_params import SamplingParams

QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Explain why the sky is blue.",
    "List three uses of a paperclip.",
    "How do vaccines work?",
    "Give me a recipe for pancakes.",
    "What is a prime number?",
    "Describe the water cycle.",
]


@dataclass
class Result:
    tokens: int
    seconds: float
    ttft: float | None = None
    tpot: float | None = None

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds


def chat_prompts(loaded: LoadedModel, count: int) -> list[list[int]]:
    tok = loaded.tokenizer
    prompts = []
    for i in range(count):
        question = f"{QUESTIONS[i % len(QUESTIONS)]} (request {i})"
        text = tok.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        prompts.append(tok(text, add_special_tokens=False)["input_ids"])
    return prompts


def run_engine(engine: LLMEngine, prompts: list[list[int]], new_tokens: int) -> Result:
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    tokens = 0
    for i, prompt in enumerate(prompts):
        engine.add_request(EngineRequest(f"bench-{start}-{i}", prompt, params))
    while engine.has_unfinished():
        for out in engine.step():
            now = time.perf_counter()
            got = sum(len(c.token_ids) for c in out.outputs)
            tokens += got
            if got and out.request_id not in first:
                first[out.request_id] = now - start
            if out.finished:
                done[out.request_id] = now - start
    seconds = time.perf_counter() - start
    ttft = sum(first.values()) / len(first)
    tpot = sum((done[r] - first[r]) / (new_tokens - 1) for r in done) / len(done)
    return Result(tokens, seconds, ttft, tpot)


@torch.inference_mode()
def run_hf(model, pad_id: int, prompts: list[list[int]], new_tokens: int) -> Result:
    """One static left-padded batch of all prompts through ``generate``."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    start = time.perf_counter()
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=pad_id,
    )
    seconds = time.perf_counter() - start
    return Result((out.shape[1] - width) * len(prompts), seconds)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--quantization", default="auto")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    loaded = load_model(None, dtype=args.dtype, quantization=args.quantization)
    config = EngineConfig(
        dtype=args.dtype, quantization=args.quantization, max_num_seqs=max(levels)
    )
    engine = LLMEngine(config, loaded=loaded)
    print(
        f"model {loaded.model_id}, dtype {loaded.dtype}, quantization {loaded.quantization},"
        f" threads {torch.get_num_threads()}"
    )
    run_engine(engine, chat_prompts(loaded, 2), 8)  # warm-up
    ours = {c: run_engine(engine, chat_prompts(loaded, c), args.new_tokens) for c in levels}
    engine_rss = peak_rss_mb()

    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(loaded.hf_folder, dtype=loaded.dtype).eval()
    pad_id = loaded.tokenizer.pad_token_id or 0
    run_hf(hf, pad_id, chat_prompts(loaded, 2), 8)  # warm-up
    # c=1 is one prompt at a time (sequential); c>1 one static batch of c prompts. The
    # engine reruns right after each HF level so each ratio compares runs under the same load.
    theirs, paired = {}, {}
    for c in levels:
        theirs[c] = run_hf(hf, pad_id, chat_prompts(loaded, c), args.new_tokens)
        paired[c] = run_engine(engine, chat_prompts(loaded, c), args.new_tokens)

    print(f"\n{args.new_tokens} new tokens per request, ignore_eos, greedy")
    header = (
        "  c | engine tok/s | TTFT ms | TPOT ms | HF tok/s | HF mode            | "
        "engine rerun | ratio (rerun/HF)"
    )
    print(header)
    for c in levels:
        o, h, p = ours[c], theirs[c], paired[c]
        mode = "sequential" if c == 1 else f"static batch of {c}"
        print(
            f"{c:>3} | {o.tok_s:>12.1f} | {o.ttft * 1e3:>7.0f} | {o.tpot * 1e3:>7.1f} | "
            f"{h.tok_s:>8.1f} | {mode:<18} | {p.tok_s:>12.1f} | {p.tok_s / h.tok_s:>5.2f}x"
        )
    print(f"engine peak RSS (before HF loaded): {engine_rss:.0f} MB")


if __name__ == "__main__":
    main()
