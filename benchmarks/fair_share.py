"""Interactive latency beside batch work, and fair share between two batch tenants, per policy.

Starts one `inhouse serve` (bundled model, CPU) per scheduling policy (``--policies``,
default fcfs and fair; both stay loaded, and only one is driven at a time) and runs, each
scenario on every policy in turn before the next scenario (so slow drift of a shared host
hits every policy alike):

(a) idle: the interactive tenant sends ``--chats`` short chats one after another: TTFT;
(b) alone: the batch tenant keeps ``--batch-inflight`` requests of ``--prompt-tokens``
    prompt words and ``--output-tokens`` output tokens in flight: its output tok/s;
    mixed: the same, while the interactive tenant sends its chats: interactive TTFT p50
    and p99 (vs idle) and batch output tok/s (vs alone);
(c) two batch tenants keep ``--split`` (12,4) requests in flight: each one's output tok/s.

Driving serve directly (``--tenancy body``, the default when this script starts the
servers), a request names its tenant in ``cache_salt`` and its class in vLLM's ``priority``
(interactive -1, batch 1). ``--base-url`` points at a running server or a gateway instead
(one "policy", whatever it runs); with ``--tenancy keys`` the body carries neither and the
gateway derives both from the API keys ``--interactive-key`` and ``--batch-key`` (and
``--batch-key-2`` for the second batch tenant of (c)).

Output tokens are counted as they stream (vLLM's ``continuous_usage_stats``), over the
window after every batch slot has received its first token, so a 256-token request need
not finish within it. Prints each server's serve flags, the load average at the start and
after each round, and one compact table a round (p99 / idle and batch mixed / alone are the
same-run ratios); with ``--rounds N`` > 1, each server's median ratios and their range.

``--variant NAME=POLICY [serve flags]`` (repeatable, instead of ``--policies``) starts one
server per variant, e.g. to compare background rows:
``--variant rows4=fair --variant 'rows8=fair --background-decode-rows=8'``.

    .venv/bin/python benchmarks/fair_share.py [--policies fcfs,fair] [--seconds 60]
        [--prompt-tokens 1000] [--output-tokens 256] [--rounds 3] [--variant ...]
        [--base-url URL --tenancy keys ...]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).parent))

from knee_prediction import inhouse
from vs_llamacpp import free_port, wait_ready

# Common words of about one token each, so a prompt of N of them is about N tokens.
_TEXT = """
time year people way day man thing woman life child world school state family student group
country problem hand part place case week company system program question work government
number night point home water room mother area money story fact month lot right study book
eye job word business issue side kind head house service friend father power hour game line
end member law car city community name president team minute idea
"""
WORDS = _TEXT.split()
INTERACTIVE, BATCH = -1, 1
_SEEDS = itertools.count()


@dataclass
class Tenant:
    """Who sends: the API key, and what the body says when the server cannot tell."""

    name: str
    key: str
    priority: int
    tenancy: str

    def extra(self) -> dict:
        if self.tenancy == "keys":
            return {}
        return {"cache_salt": self.name, "priority": self.priority}


@dataclass
class Counted:
    """Output tokens streamed per tenant since ``start``; None until the window opens."""

    start: float | None = None
    tokens: dict[str, int] = field(default_factory=dict)

    def add(self, tenant: str, count: int) -> None:
        if self.start is not None and count:
            self.tokens[tenant] = self.tokens.get(tenant, 0) + count


def prompt(rng: random.Random, words: int) -> str:
    body = " ".join(rng.choice(WORDS) for _ in range(words))
    return f"Summarise these words in one long paragraph: {body}"


async def stream_tokens(
    client: openai.AsyncOpenAI, model: str, tenant: Tenant, text: str, max_tokens: int,
    on_tokens,
) -> float | None:  # fmt: skip
    """Stream one greedy chat; ``on_tokens(n)`` for each chunk's new output tokens; the
    seconds to the first token."""
    started = time.perf_counter()
    ttft = None
    seen = 0
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], max_tokens=max_tokens,
        temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"ignore_eos": True, **tenant.extra()},
    )  # fmt: skip
    async for chunk in stream:
        if chunk.usage is not None:
            new = chunk.usage.completion_tokens - seen
            seen = chunk.usage.completion_tokens
        else:
            new = 1 if chunk.choices and chunk.choices[0].delta.content else 0
            seen += new
        if new and ttft is None:
            ttft = time.perf_counter() - started
        on_tokens(new)
    return ttft


async def keep_in_flight(
    client: openai.AsyncOpenAI, model: str, tenant: Tenant, count: int, args, counted: Counted,
    first_tokens: asyncio.Queue, stop: asyncio.Event,
) -> None:  # fmt: skip
    """``count`` request loops of one tenant until ``stop``; each slot reports its first token."""

    async def slot(k: int) -> None:
        rng = random.Random(next(_SEEDS))  # no prompt is sent twice: no prefix-cache hits
        reported = False

        def on_tokens(n: int) -> None:
            nonlocal reported
            counted.add(tenant.name, n)
            if n and not reported:
                reported = True
                first_tokens.put_nowait(k)

        while not stop.is_set():
            await stream_tokens(
                client, model, tenant, prompt(rng, args.prompt_tokens), args.output_tokens,
                on_tokens,
            )  # fmt: skip

    tasks = [asyncio.create_task(slot(k)) for k in range(count)]
    await stop.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def chats(client: openai.AsyncOpenAI, model: str, tenant: Tenant, n: int) -> list[float]:
    """``n`` short chats one after another; their TTFTs."""
    ttfts = []
    for i in range(n):
        text = f"Name one fact about the number {i}."
        ttft = await stream_tokens(client, model, tenant, text, 16, lambda _n: None)
        ttfts.append(ttft or float("nan"))
    return ttfts


async def batch_load(
    base_url: str, model: str, batch: list[tuple[Tenant, int]], args, interactive: Tenant | None
) -> tuple[dict[str, float], list[float]]:
    """Batch tenants' output tok/s over the window (``--seconds``, or longer while the
    interactive chats run), and the chats' TTFTs."""
    clients = {t.name: _client(base_url, t.key) for t, _ in batch}
    counted, stop = Counted(), asyncio.Event()
    first_tokens: asyncio.Queue = asyncio.Queue()
    loops = [
        asyncio.create_task(
            keep_in_flight(clients[t.name], model, t, n, args, counted, first_tokens, stop)
        )
        for t, n in batch
    ]
    for _ in range(sum(n for _, n in batch)):  # every slot streams: the steady state
        await first_tokens.get()
    counted.start = time.perf_counter()
    ttfts: list[float] = []
    if interactive is not None:
        client = _client(base_url, interactive.key)
        ttfts = await chats(client, model, interactive, args.chats)
        await client.close()
    await asyncio.sleep(max(0.0, args.seconds - (time.perf_counter() - counted.start)))
    elapsed = time.perf_counter() - counted.start
    stop.set()
    await asyncio.gather(*loops)
    for client in clients.values():
        await client.close()
    return {t.name: counted.tokens.get(t.name, 0) / elapsed for t, _ in batch}, ttfts


def _client(base_url: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=900)


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def start_serve(
    name: str, policy: str, extra: list[str], args, log_dir: Path
) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [
        inhouse(), "serve", "--port", str(port), "--scheduling-policy", policy,
        "--max-model-len", str(args.max_model_len), "--kv-cache-memory", args.kv_cache_memory,
        "--embedding-model", "none", *args.serve_arg, *extra,
    ]  # fmt: skip
    log = (log_dir / f"serve-{name}.log").open("w")
    proc = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "INHOUSE_API_KEY": "k"}
    )
    wait_ready(f"http://127.0.0.1:{port}/health", proc, 600)
    return proc, f"http://127.0.0.1:{port}"


async def run(servers: dict[str, str], model: str, args) -> dict[str, dict]:
    tenancy = args.tenancy
    chat = Tenant("alice", args.interactive_key, INTERACTIVE, tenancy)
    etl = Tenant("etl", args.batch_key, BATCH, tenancy)
    etl2 = Tenant("etl2", args.batch_key_2 or args.batch_key, BATCH, tenancy)
    big, small = (int(x) for x in args.split.split(","))
    out: dict[str, dict] = {name: {} for name in servers}
    for scenario in args.scenarios.split(","):
        for name, url in servers.items():
            began = time.perf_counter()
            row = out[name]
            if scenario == "idle":
                client = _client(url, chat.key)
                await chats(client, model, chat, 2)  # warm-up
                row["idle"] = await chats(client, model, chat, args.chats)
                await client.close()
            elif scenario == "alone":
                rates, _ = await batch_load(url, model, [(etl, args.batch_inflight)], args, None)
                row["alone"] = rates["etl"]
            elif scenario == "mixed":
                rates, ttfts = await batch_load(
                    url, model, [(etl, args.batch_inflight)], args, chat
                )
                row["mixed"], row["mixed_ttft"] = rates["etl"], ttfts
            else:
                rates, _ = await batch_load(url, model, [(etl, big), (etl2, small)], args, None)
                row["split"] = (rates["etl"], rates["etl2"])
            print(f"  {scenario:<6} {name:<9} {time.perf_counter() - began:6.0f} s", flush=True)
    return out


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min), {os.cpu_count()} CPUs"


def ratios(r: dict) -> tuple[float | None, float | None]:
    """(interactive p99 TTFT mixed / idle, batch tok/s mixed / alone) of one round."""
    idle, mixed, alone, batch = r.get("idle"), r.get("mixed_ttft"), r.get("alone"), r.get("mixed")
    ttft = p(mixed, 0.99) / p(idle, 0.99) if idle and mixed else None
    return ttft, (batch / alone if alone and batch is not None else None)


def summary(rounds: list[dict[str, dict]]) -> None:
    """Each server's ratios over the rounds: median, and the range."""
    print(f"\nover {len(rounds)} rounds: median (min–max)")
    for name in rounds[0]:
        cells = [f"{name:<9}"]
        for label, k in (("p99/idle", 0), ("batch mixed/alone", 1)):
            got = sorted(x for x in (ratios(r[name])[k] for r in rounds) if x is not None)
            if got:
                cells.append(f"{label} {statistics.median(got):.2f} ({got[0]:.2f}–{got[-1]:.2f})")
        print(" | ".join(cells))


def show(results: dict[str, dict], args) -> None:
    """One row per server; a scenario not run shows as a dash."""
    big, small = args.split.split(",")
    print(f"\n{load()} at the end")
    print(
        f"{'policy':<9} | {'idle TTFT p50/p99':>17} | {'mixed TTFT p50/p99':>18} "
        f"{'p99/idle':>8} | {'batch tok/s alone':>17} {'mixed':>6} {'ratio':>5} | "
        f"{'split ' + big + ':' + small + ' tok/s':>16} {'ratio':>5}"
    )
    for name, r in results.items():
        idle, mixed = r.get("idle"), r.get("mixed_ttft")
        ttft_ratio, batch_ratio = ratios(r)
        cells = [f"{name:<9}"]
        cells.append(f"{p(idle, 0.5):8.3f}/{p(idle, 0.99):.3f} s" if idle else f"{'—':>17}")
        if mixed:
            ratio = f"{ttft_ratio:8.2f}" if ttft_ratio is not None else f"{'—':>8}"
            cells.append(f"{p(mixed, 0.5):8.3f}/{p(mixed, 0.99):.3f} s {ratio}")
        else:
            cells.append(f"{'—':>18} {'—':>8}")
        alone, batch = r.get("alone"), r.get("mixed")
        share = f"{batch_ratio:5.2f}" if batch_ratio is not None else f"{'—':>5}"
        alone_cell = f"{alone:17.1f}" if alone is not None else f"{'—':>17}"
        batch_cell = f"{batch:6.1f}" if batch is not None else f"{'—':>6}"
        cells.append(f"{alone_cell} {batch_cell} {share}")
        if "split" in r:
            a, b = r["split"]
            cells.append(f"{a:8.1f} / {b:5.1f} {a / b if b else float('inf'):5.2f}")
        else:
            cells.append(f"{'—':>16} {'—':>5}")
        print(" | ".join(cells))
    for name, r in results.items():
        idle, mixed = r.get("idle"), r.get("mixed_ttft")
        if idle and mixed and len(mixed) > 1:
            rest = p(mixed[1:], 0.99)
            print(
                f"{name}: the first chat {mixed[0]:.3f} s (it meets the batch's steps before any "
                f"interactive work), the other {len(mixed) - 1} p99 {rest:.3f} s "
                f"({rest / p(idle, 0.99):.2f}× idle p99)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policies", default="fcfs,fair")
    parser.add_argument("--base-url", default=None, help="a running server or gateway")
    parser.add_argument("--model", default=None, help="model name (default: the server's)")
    parser.add_argument("--tenancy", choices=("body", "keys"), default=None)
    parser.add_argument("--interactive-key", default="k")
    parser.add_argument("--batch-key", default="k")
    parser.add_argument("--batch-key-2", default=None)
    parser.add_argument("--scenarios", default="idle,alone,mixed,split")
    parser.add_argument("--chats", type=int, default=20)
    parser.add_argument("--batch-inflight", type=int, default=16)
    parser.add_argument("--split", default="12,4")
    parser.add_argument("--prompt-tokens", type=int, default=1000, help="prompt words")
    parser.add_argument("--output-tokens", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=60, help="window of the batch phases")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--kv-cache-memory", default="768MiB")
    parser.add_argument("--serve-arg", action="append", default=[], help="more serve flags")
    parser.add_argument(
        "--variant", action="append", default=[],
        help="a server to compare, NAME=POLICY [serve flags], e.g. 'rows2=fair "
        "--background-decode-rows=2' (repeatable; replaces --policies)",
    )  # fmt: skip
    parser.add_argument(
        "--rounds", type=int, default=1, help="run the scenarios this many times; print each"
    )
    args = parser.parse_args()
    args.tenancy = args.tenancy or ("keys" if args.base_url else "body")
    procs, commands, rounds = [], {}, []
    try:
        if args.base_url:
            servers = {"external": args.base_url.rstrip("/")}
        else:
            log_dir = Path(tempfile.mkdtemp(prefix="fair-share-"))
            servers = {}
            for spec in args.variant or args.policies.split(","):
                name, _, rest = spec.partition("=")
                policy, *extra = shlex.split(rest or name)
                proc, url = start_serve(name, policy, extra, args, log_dir)
                procs.append(proc)
                servers[name] = url
                flags = ["--scheduling-policy", policy, *args.serve_arg, *extra]
                commands[name] = shlex.join(flags)
            print(f"server logs in {log_dir}")
        model = args.model or _served_model(next(iter(servers.values())), args.batch_key)
        for name, flags in commands.items():
            print(f"{name}: inhouse serve {flags}")
        print(f"{load()} at the start")
        for number in range(1, args.rounds + 1):
            print(f"round {number} of {args.rounds}")
            rounds.append(asyncio.run(run(servers, model, args)))
            show(rounds[-1], args)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
    if len(rounds) > 1:
        summary(rounds)


def _served_model(base_url: str, key: str) -> str:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=key).models.list().data[0].id


if __name__ == "__main__":
    main()
