"""Prefix-aware routing against least-loaded routing, on two replicas behind the gateway.

For each engine asked (inhouse on the bundled GGUF, llama.cpp's llama-server on the same
file), in one run, one configuration after another (repeated `--rounds` times, the order
turned each round), each a fresh `inhouse up` with empty caches:

- `single`: one replica (`--replicas 1`), the hit rate a prefix can reach at best;
- `prefix` and `least-loaded`: two replicas, `inhouse up --routing …`.

Each runs the shared-prefix mix: `--docs` documents of about `--doc-tokens` tokens, each
asked `--questions` questions (the document first, the question after it), all shuffled,
`--concurrency` at a time, streamed; it reports the TTFT p50 and p90 and the prefix-cache
hit rate from the replicas' own counters (inhouse: `prefix_cache_hits / queries`;
llama.cpp: 1 - `prompt_tokens_total`, the prompt tokens it computed, over the prompt tokens
its answers counted). Then, on the two-replica configurations, unique prompts (no shared
prefix) at the same concurrency: output tokens per second.

    .venv/bin/python benchmarks/prefix_routing.py [--engines inhouse,llama.cpp] [--rounds 1]
        [--requests-out DIR]

`--requests-out` writes each configuration's requests of the mix (TTFT, token counts with
the cached prompt tokens) to DIR/<engine>-<config>-<round>.json, for seeing which
requests missed and which waited.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from inhouse.engine.kernels.build import cpu_flags
from inhouse.gateway.backends import sample_totals
from inhouse.launch import BACKENDS
from inhouse.launch.ports import free_port
from inhouse.manifests.bundled import DEFAULT_CHAT_MODEL_NAME
from inhouse.up.command import REPLICA_KEY_ENV

REPLICA_KEY = "prefix-routing-bench"  # every replica's key: llama.cpp's /metrics asks for it
REPLICA_AUTH = {"Authorization": f"Bearer {REPLICA_KEY}"}

WORDS = (  # noqa: SIM905 (a sentence of words reads better than a list of 57 strings)
    "tenant landlord premises repair deposit notice clause term rent payment schedule party "
    "agreement property liability insurance damage access inspection utility service period "
    "renewal termination default remedy dispute arbitration law county state signature date "
    "witness amendment assignment sublet occupancy guest pet smoking noise parking storage "
    "garden roof window door lock key alarm heating water electricity gas internet waste"
).split()


def text(rng: random.Random, words: int) -> str:
    sentences, left = [], words
    while left > 0:
        n = min(left, rng.randint(8, 16))
        sentences.append(" ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + ".")
        left -= n
    return " ".join(sentences)


def shared_prefix_mix(docs: int, questions: int, doc_tokens: int, seed: int) -> list[str]:
    """Each document with each question after it, shuffled."""
    rng = random.Random(seed)
    documents = [f"Document {d}. " + text(rng, int(doc_tokens / 1.3)) for d in range(docs)]
    prompts = [
        f"{doc}\n\nQuestion {q}: what does the document say about {rng.choice(WORDS)}?"
        for doc in documents
        for q in range(questions)
    ]
    rng.shuffle(prompts)
    return prompts


def unique_prompts(count: int, tokens: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"{i} {text(rng, int(tokens / 1.3))}" for i in range(count)]


class Up:
    """`inhouse up` on the bundled model; its gateway, admin key and replicas' URLs."""

    def __init__(self, engine: str, replicas: int, routing: str, home: Path) -> None:
        self.port = free_port()
        self.log = home / "up.log"
        argv = [sys.executable, "-m", "inhouse", "up", "--engine", engine, "--replicas",
                str(replicas), "--routing", routing, "--port", str(self.port),
                "--no-embeddings", "--max-model-len", "4096"]  # fmt: skip
        env = {**os.environ, "INHOUSE_HOME": str(home / "home"), REPLICA_KEY_ENV: REPLICA_KEY}
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.gateway = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 900
        while self.log.read_text().count(" is ready on ") < replicas:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(self.log.read_text()[-3000:])
            time.sleep(1)
        found = self.log.read_text()
        self.key = re.findall(r"^ih-\S+$", found, re.MULTILINE)[0]
        self.replicas = re.findall(r"^replica \S+: pid \d+ on (\S+)$", found, re.MULTILINE)

    def counters(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for url in self.replicas:
            page = httpx.get(f"{url}/metrics", headers=REPLICA_AUTH, timeout=30).text
            for name, value in sample_totals(page).items():
                totals[name] = totals.get(name, 0.0) + value
        return totals

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=120)


async def one(client: httpx.AsyncClient, up: Up, prompt: str, max_tokens: int) -> dict:
    body = {"model": DEFAULT_CHAT_MODEL_NAME, "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": prompt}],
            "stream_options": {"include_usage": True}}  # fmt: skip
    sent, first, usage = time.monotonic(), None, None
    headers = {"Authorization": f"Bearer {up.key}"}
    async with client.stream("POST", f"{up.gateway}/v1/chat/completions", json=body,
                             headers=headers) as answer:  # fmt: skip
        assert answer.status_code == 200, await answer.aread()
        async for line in answer.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices"):
                first = time.monotonic() - sent
            usage = chunk.get("usage") or usage
    assert first is not None and usage is not None
    return {"ttft": first, **usage}


async def run_mix(up: Up, prompts: list[str], concurrency: int, max_tokens: int) -> list[dict]:
    queue = list(prompts)
    results: list[dict] = []
    async with httpx.AsyncClient(timeout=600) as client:

        async def worker() -> None:
            while queue:
                results.append(await one(client, up, queue.pop(0), max_tokens))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


def hit_rate(engine: str, before: dict, after: dict, results: list[dict]) -> float:
    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    if engine == "llama.cpp":  # no prefix-cache counters: the prompt tokens it computed
        prompt = sum(r["prompt_tokens"] for r in results)
        return 1 - delta("llamacpp:prompt_tokens_total") / prompt
    names = BACKENDS[engine].metrics
    assert names is not None
    return delta(f"{names.prefix_hits[0]}_total") / delta(f"{names.prefix_queries[0]}_total")


def measure(engine: str, replicas: int, routing: str, args: argparse.Namespace, label: str) -> dict:
    with tempfile.TemporaryDirectory() as home:
        up = Up(engine, replicas, routing, Path(home))
        try:
            mix = shared_prefix_mix(args.docs, args.questions, args.doc_tokens, args.seed)
            warm = unique_prompts(4 * replicas, 100, args.seed + 2)  # unmeasured
            asyncio.run(run_mix(up, warm, args.concurrency, 4))
            before = up.counters()
            results = asyncio.run(run_mix(up, mix, args.concurrency, args.max_tokens))
            after = up.counters()
            if args.requests_out:
                args.requests_out.mkdir(parents=True, exist_ok=True)
                (args.requests_out / f"{engine}-{label}.json").write_text(json.dumps(results))
            ttfts = sorted(r["ttft"] for r in results)
            figures = {
                "ttft_p50": statistics.median(ttfts),
                "ttft_p90": ttfts[int(0.9 * (len(ttfts) - 1))],
                "hit_rate": hit_rate(engine, before, after, results),
            }
            if replicas > 1:
                unique = unique_prompts(args.unique, args.unique_tokens, args.seed + 1)
                started = time.monotonic()
                done = asyncio.run(run_mix(up, unique, args.concurrency, args.unique_out))
                seconds = time.monotonic() - started
                figures["unique_tok_s"] = sum(r["completion_tokens"] for r in done) / seconds
            return figures
        finally:
            up.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="inhouse,llama.cpp")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--docs", type=int, default=8)
    parser.add_argument("--questions", type=int, default=6)
    parser.add_argument("--doc-tokens", type=int, default=1500)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--unique", type=int, default=32)
    parser.add_argument("--unique-tokens", type=int, default=200)
    parser.add_argument("--unique-out", type=int, default=64)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--requests-out", type=Path, default=None)
    args = parser.parse_args()
    print(f"CPU flags: {' '.join(sorted(cpu_flags()))}")
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {vars(args)}")
    configs = [(1, "prefix", "single"), (2, "prefix", "prefix"), (2, "least-loaded", "least")]
    for engine in args.engines.split(","):
        runs: dict[str, list[dict]] = {name: [] for _, _, name in configs}
        for round_ in range(args.rounds):
            for replicas, routing, name in configs if round_ % 2 == 0 else configs[::-1]:
                figures = measure(engine, replicas, routing, args, f"{name}-{round_ + 1}")
                runs[name].append(figures)
                shown = ", ".join(f"{k} {v:.3f}" for k, v in figures.items())
                print(f"{engine} {name} (round {round_ + 1}): {shown}", flush=True)

        report(engine, runs)


def report(engine: str, runs: dict[str, list[dict]]) -> None:
    """The ratios the issue asks for, over the rounds' means."""

    def ratio(key: str, top: str, bottom: str) -> float:
        return statistics.mean(r[key] for r in runs[top]) / statistics.mean(
            r[key] for r in runs[bottom]
        )

    print(
        f"{engine}: hit rate prefix/single {ratio('hit_rate', 'prefix', 'single'):.2f} "
        f"(least-loaded/single {ratio('hit_rate', 'least', 'single'):.2f}); TTFT p50 "
        f"prefix/least-loaded {ratio('ttft_p50', 'prefix', 'least'):.2f}; unique tok/s "
        f"prefix/least-loaded {ratio('unique_tok_s', 'prefix', 'least'):.3f}"
    )


if __name__ == "__main__":
    main()
