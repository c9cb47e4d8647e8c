"""The speculative workload over HTTP: `inhouse serve` with and without
``--speculative-config`` against llama.cpp's `llama-server` with and without its own
lookup decoding (``--spec-type ngram-*``), on the same GGUF.

Each server answers the same chat requests (the incident report of
``benchmarks/speculative.py`` and one of its tasks), greedy, up to ``--new-tokens`` tokens;
``c`` requests are in flight at a time. Every server is started first (an idle one sleeps);
then each level runs in rounds of ``c`` requests, every server taking the round in turn, the
order reversed every other round, so a drifting host weighs on every column alike. Output
tok/s is completion tokens over the servers' time in their rounds. Our two servers must
answer with the same text; llama.cpp's numerics are
its own, so its answers are not compared. Each llama-server variant runs; the table's
llama.cpp ratio is against the fastest of them (the issue's "whichever is faster").

    .venv/bin/python benchmarks/speculative_servers.py --llama-server PATH
        [--concurrency 1,16] [--new-tokens 256] [--requests 8]
        [--llama-spec "--spec-type ngram-simple" --llama-spec "..."]
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))

from inhouse.manifests.bundled import DEFAULT_CHAT_MODEL_NAME, default_chat_model
from speculative import DEFAULT_SPEC, TASKS, TEXT, WARM_UP
from vs_llamacpp import free_port, stop, wait_ready

LLAMA_SPECS = [
    "--spec-type ngram-simple",
    "--spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8",
    "--spec-type ngram-mod",  # its n-gram store is shared by all slots, kept across requests
    "--spec-type ngram-cache",
]


@dataclass(slots=True)
class Level:
    """One concurrency level on one server: completion tokens, seconds, texts by request."""

    tokens: int = 0
    seconds: float = 0.0
    texts: list[str] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds


def ask(
    client: httpx.Client, url: str, model: str, task: str, new_tokens: int, text: str = TEXT
) -> tuple[int, str]:
    """One task on ``text`` (the report; empty: the task alone); tokens and reply."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"{text}\n{task}".strip()}],
        "temperature": 0,
        "max_tokens": new_tokens,
    }
    reply = client.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    reply.raise_for_status()
    data = reply.json()
    return data["usage"]["completion_tokens"], data["choices"][0]["message"]["content"]


def drive(
    client: httpx.Client, url: str, model: str, tasks: list[str], new_tokens: int, level: Level
) -> None:
    """One round: ``tasks`` all in flight at once, added to ``level``."""
    with ThreadPoolExecutor(len(tasks)) as pool:
        start = time.perf_counter()
        answers = list(pool.map(lambda t: ask(client, url, model, t, new_tokens), tasks))
        level.seconds += time.perf_counter() - start
    level.tokens += sum(n for n, _ in answers)
    level.texts += [text for _, text in answers]


def start_server(stack: ExitStack, command: list[str], port: int, model: str, log: Path) -> str:
    """Start a server (stopped when ``stack`` closes), wait for it, warm it up; its URL."""
    out = stack.enter_context(log.open("w"))
    proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    stack.callback(stop, proc)
    wait_ready(f"http://127.0.0.1:{port}/health", proc, 600)
    url = f"http://127.0.0.1:{port}"
    with httpx.Client() as client:
        ask(client, url, model, WARM_UP, 8, text="")
    return url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", required=True, type=Path, help="llama-server binary")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--requests", type=int, default=8, help="requests per level (≥ c)")
    parser.add_argument("--speculative-config", default=DEFAULT_SPEC)
    parser.add_argument("--serve-args", default="", help="extra `inhouse serve` flags")
    parser.add_argument("--llama-spec", action="append", help="llama-server speculation flags")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    args.levels = [int(c) for c in args.concurrency.split(",")]
    gguf, model = default_chat_model(), DEFAULT_CHAT_MODEL_NAME
    inhouse = str(Path(sys.executable).with_name("inhouse"))

    def serve(port: int) -> list[str]:
        return [inhouse, "serve", "--port", str(port), *shlex.split(args.serve_args)]

    def llama(port: int) -> list[str]:
        return [str(args.llama_server), "-m", str(gguf), "-t", str(args.threads), "-np", "16",
                "-c", "32768", "--host", "127.0.0.1", "--port", str(port), "-a", model]  # fmt: skip

    servers = {
        "inhouse": serve,
        "inhouse spec": lambda port: [
            *serve(port),
            "--speculative-config",
            args.speculative_config,
        ],
        "llama.cpp": llama,
    }
    for i, flags in enumerate(args.llama_spec or LLAMA_SPECS):
        servers[f"llama.cpp spec {i + 1}"] = lambda port, f=flags: [*llama(port), *shlex.split(f)]
    cpu_flags = sorted({f for f in Path("/proc/cpuinfo").read_text().split() if "avx" in f})
    print(f"GGUF {gguf.name}; {args.threads} threads; CPU flags: {' '.join(cpu_flags)}")
    results = {name: {c: Level() for c in args.levels} for name in servers}
    with tempfile.TemporaryDirectory(prefix="spec-servers-") as tmp, ExitStack() as stack:
        urls = {}
        for name, command_at in servers.items():
            port = free_port()
            print(f"starting {name}: {shlex.join(command_at(port))}", flush=True)
            log = Path(tmp) / f"server-{len(urls)}.log"
            urls[name] = start_server(stack, command_at(port), port, model, log)
        client = stack.enter_context(httpx.Client())
        for c in args.levels:
            tasks = [TASKS[i % len(TASKS)] for i in range(max(args.requests, c))]
            for number, at in enumerate(range(0, len(tasks), c)):
                order = list(servers)[:: 1 if number % 2 == 0 else -1]
                for name in order:
                    drive(
                        client,
                        urls[name],
                        model,
                        tasks[at : at + c],
                        args.new_tokens,
                        results[name][c],
                    )
    print(f"\nup to {args.new_tokens} new tokens per request, greedy, tok/s per server")
    names = list(results)
    print("  c | " + " | ".join(f"{n:>16}" for n in names) + " | spec/plain | spec/best llama")
    for c in args.levels:
        rates = {n: results[n][c].tok_s for n in names}
        best = max(v for n, v in rates.items() if n.startswith("llama.cpp"))
        same = results["inhouse"][c].texts == results["inhouse spec"][c].texts
        print(
            f"{c:>3} | "
            + " | ".join(f"{rates[n]:>16.1f}" for n in names)
            + f" | {rates['inhouse spec'] / rates['inhouse']:>9.2f}x"
            + f" | {rates['inhouse spec'] / best:>14.2f}x"
            + ("" if same else "  (texts differ!)")
        )
    for i, flags in enumerate(args.llama_spec or LLAMA_SPECS):
        print(f"llama.cpp spec {i + 1}: {flags}")


if __name__ == "__main__":
    main()
