"""LoRA adapters' cost over HTTP: one `inhouse serve` of the bundled model with ``--adapters``
random PEFT adapters (rank ``--rank`` on every projection, PEFT's "all-linear"), driven the
same way with and without them.

- c=16: 16 chat streams at once, all on the base, against 16 spread evenly over the adapters
  (one batch holding every adapter and its rows);
- c=1: one stream at a time, the base against one adapter, request by request (each of the
  four questions asked of both, one after the other), so a host whose speed drifts over
  seconds weighs on both alike.

At c=16 each round runs base then adapters, the order reversed every other round; output
tok/s is completion tokens over the wall time of a side's requests. Prints each round and the
median ratio (adapters / base) per level.

    .venv/bin/python benchmarks/lora_throughput.py [--adapters 4] [--rank 16] [--rounds 3]
        [--new-tokens 128]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))

from knee_prediction import inhouse
from lora_adapters import ALL_PROJECTIONS, bundled_adapter
from vs_llamacpp import free_port, stop, wait_ready

QUESTIONS = [
    "Explain how a hash table handles collisions.",
    "Write a short poem about the sea at night.",
    "List five uses of a paperclip and why each works.",
    "Describe the water cycle for a ten-year-old.",
]


def ask(client: httpx.Client, url: str, model: str, question: str, new_tokens: int) -> int:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": new_tokens,
        "ignore_eos": True,
    }
    reply = client.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    reply.raise_for_status()
    return reply.json()["usage"]["completion_tokens"]


def round_tok_s(url: str, models: list[str], concurrency: int, new_tokens: int) -> float:
    """``concurrency`` requests at once (at least ``len(QUESTIONS)`` in all, one after another
    at c=1: one request alone is too short to time), request ``i`` to ``models[i % len]``;
    output tok/s."""
    with httpx.Client() as client, ThreadPoolExecutor(concurrency) as pool:
        start = time.perf_counter()
        jobs = [
            pool.submit(ask, client, url, models[i % len(models)], QUESTIONS[i % 4], new_tokens)
            for i in range(max(concurrency, len(QUESTIONS)))
        ]
        tokens = sum(job.result() for job in jobs)
        return tokens / (time.perf_counter() - start)


def one_at_a_time(url: str, sides: dict[str, str], new_tokens: int, flip: bool) -> dict[str, float]:
    """c=1: each question asked of every side in turn (the order flipped with ``flip``);
    each side's output tok/s over its own requests' time."""
    tokens = dict.fromkeys(sides, 0)
    seconds = dict.fromkeys(sides, 0.0)
    order = list(sides)[::-1] if flip else list(sides)
    with httpx.Client() as client:
        for i, question in enumerate(QUESTIONS):
            for side in order if i % 2 == 0 else order[::-1]:
                start = time.perf_counter()
                tokens[side] += ask(client, url, sides[side], question, new_tokens)
                seconds[side] += time.perf_counter() - start
    return {side: tokens[side] / seconds[side] for side in sides}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        names = [f"adapter{i}" for i in range(args.adapters)]
        modules = []
        for seed, name in enumerate(names):
            path = bundled_adapter(Path(tmp) / name, seed, args.rank, ALL_PROJECTIONS)
            modules += ["--lora-modules", f"{name}={path}"]
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        command = [inhouse(), "serve", "--port", str(port), "--embedding-model", "none", *modules]
        print("serve:", " ".join(command[1:]))
        with open(Path(tmp) / "serve.log", "wb") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_ready(f"{url}/health", proc, 600)
            base = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
            for concurrency in (16, 1):  # warm both paths
                round_tok_s(url, [base], concurrency, 8)
                round_tok_s(url, names, concurrency, 8)
            ratios: dict[int, list[float]] = {16: [], 1: []}
            for r in range(args.rounds):
                for concurrency, adapted in ((16, names), (1, names[:1])):
                    sides = [("base", [base]), ("adapters", adapted)]
                    got = {}
                    if concurrency == 1:
                        got = one_at_a_time(url, {"base": base, "adapters": adapted[0]},
                                            args.new_tokens, flip=r % 2 == 1)  # fmt: skip
                    for side, models in [] if got else sides if r % 2 == 0 else sides[::-1]:
                        got[side] = round_tok_s(url, models, concurrency, args.new_tokens)
                    ratio = got["adapters"] / got["base"]
                    ratios[concurrency].append(ratio)
                    print(
                        f"round {r + 1} c={concurrency}: base {got['base']:.1f} tok/s, "
                        f"{len(adapted)} adapter(s) {got['adapters']:.1f} tok/s, ratio {ratio:.2f}"
                        f"  (load {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
            for concurrency, values in ratios.items():
                print(
                    f"c={concurrency}: adapters / base median {statistics.median(values):.2f} "
                    f"(range {min(values):.2f}-{max(values):.2f})"
                )
        finally:
            stop(proc)


if __name__ == "__main__":
    main()
