"""The hostile suite of issue 24: what a hostile or careless client does to a real
`inhouse serve` (bundled chat and embedding models, ``--max-model-len 2048
--kv-cache-memory 256MiB``) and a real `inhouse gateway` in front of it, on 127.0.0.1.

On each server, in turn: schemathesis over its /openapi.json (fixed seed, a bounded
number of examples per operation and mode; `tests/edges/fuzzing.py`), then the
hand-written attacks of `hostile_bodies.py`. Meanwhile a separate process polls serve's
/health every 0.2 s, and greedy streams run beside the attacks (half straight to serve,
half through the gateway), each checked against the text the same request gave before the
attack. Every 4xx/5xx must be ``{"error": {"message", "type", "param", "code"}}``.
Serve's RSS (VmRSS of /proc/<pid>/status) is read after warm-up and after the suite.

    PYTHONPATH=$PWD/src .venv/bin/python benchmarks/hostile_suite.py [--examples 10] \
        [--out hostile-suite.json] [--model FOLDER --max-model-len N]

``--model`` serves an HF folder instead (a vision model: the image attacks then reach its
image processor and encoder).

It prints the figures and writes them as JSON; the exit status is 1 when any answer
broke the rules, a stream was harmed, /health took 1 s or more or serve's RSS grew by
more than 300 MB. Benchmark-like (a
long run that measures), so it lives in benchmarks/ and is not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests"), str(ROOT / "tests" / "edges")]

from fuzzing import Tally, fuzz  # noqa: E402  (tests/edges: the test suite's own fuzz)
from stack import Edges, Target, running_edges  # noqa: E402

from hostile_bodies import Attack, hostile_attacks  # noqa: E402

MAX_MODEL_LEN = 2048
POLL_S = 0.2
SLOW_HEALTH_S = 1.0
SETTLE_S = 5.0  # before the last RSS reading: past serve's heap trim after heavy work
RSS_GROWTH_MB = 300  # issue 24: serve's RSS after the suite within 300 MB of after warm-up
STREAM_TOKENS = 24
STREAM_PROMPT = [{"role": "user", "content": "Count from one to twenty."}]
STREAMS_PER_TARGET = 2
IN_FLIGHT = 4  # hand-written attacks in flight at once
ATTACK_TIMEOUT_S = 120.0


KV_CACHE_MIB = 256  # the KV cache is one mapping of up to this size
KV_CACHE_MEMORY = f"{KV_CACHE_MIB}MiB"


def rss_mb(pid: int) -> tuple[float, float]:
    """Resident set size of a process and of its KV cache's mapping, in MB.

    serve maps its KV cache anonymously (``mmap(-1, n)``: a shared ``/dev/zero`` mapping)
    and zero pages become resident only as tokens are first written to a block, so RSS
    grows by up to the KV budget as traffic first fills it: reserved memory, not a leak.
    What grows outside that mapping is what the issue bounds."""
    total = kv = 0
    in_kv = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        field, _, rest = line.partition(":")
        if " " in field:  # a mapping's header: address range, perms, ..., path
            in_kv = line.rstrip().endswith("/dev/zero (deleted)")
        elif field == "Size":
            in_kv = in_kv and int(rest.split()[0]) <= KV_CACHE_MIB * 1024
        elif field == "Rss":
            total += int(rest.split()[0])
            kv += int(rest.split()[0]) if in_kv else 0
    return total / 1024, kv / 1024


def host() -> dict[str, Any]:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    return {
        "cpu": fields.get("Model name", "").strip(),
        "cpus": os.cpu_count(),
        "flags": fields.get("Flags", "").strip(),
        "load_average": os.getloadavg(),
    }


def poll_health(url: str, stop: Any, out: Any) -> None:
    """In its own process: GET `url` every POLL_S until `stop` is set; sends the list of
    (monotonic start, seconds, status) to `out` (status 0: no answer within 30 s)."""
    polls: list[tuple[float, float, int]] = []
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            start = time.monotonic()
            try:
                status = client.get(url).status_code
            except httpx.HTTPError:
                status = 0
            took = time.monotonic() - start
            polls.append((start, took, status))
            time.sleep(max(0.0, POLL_S - took))
    out.send(polls)


@dataclass
class Streams:
    """Greedy streams run beside the attack, each compared with its text before it."""

    expected: str
    completed: int = 0
    harmed: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)


async def stream_once(client: openai.AsyncOpenAI, model: str) -> tuple[str, str]:
    """One greedy stream of STREAM_TOKENS tokens: (text, finish reason)."""
    stream = await client.chat.completions.create(
        model=model, messages=STREAM_PROMPT, max_tokens=STREAM_TOKENS, temperature=0,
        stream=True, extra_body={"ignore_eos": True},
    )  # fmt: skip
    text, reason = "", ""
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            reason = choice.finish_reason or reason
    return text, reason


async def run_streams(targets: list[Target], streams: Streams) -> None:
    async def worker(target: Target) -> None:
        client = openai.AsyncOpenAI(
            base_url=f"{target.url}/v1", api_key=target.key, max_retries=0, timeout=300
        )
        while not streams.stop.is_set():
            try:
                text, reason = await stream_once(client, target.chat_model)
            except openai.OpenAIError as err:
                streams.harmed.append(f"{target.name}: {type(err).__name__}: {err}"[:300])
                continue
            if reason == "length" and text == streams.expected:
                streams.completed += 1
            else:
                streams.harmed.append(f"{target.name}: {reason!r} {text!r}"[:300])
        await client.close()

    await asyncio.gather(*(worker(t) for t in targets for _ in range(STREAMS_PER_TARGET)))


@dataclass
class Attacked:
    """What one server answered: the fuzz's and the hand-written attacks' tallies, and
    when each hand-written attack was in flight (to name what a slow /health overlapped)."""

    fuzz: Tally
    bodies: Tally
    windows: list[tuple[float, float, str]]
    seconds: float


async def send_attacks(target: Target, attacks: list[Attack]) -> tuple[Tally, list]:
    tally, windows = Tally(), []
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def send(http: httpx.AsyncClient, attack: Attack) -> None:
        auth = [f"Bearer {target.key}"] if attack.auth is None else list(attack.auth)
        headers = [("Content-Type", attack.content_type), *(("Authorization", a) for a in auth)]
        label = f"{attack.method} {attack.path} [{attack.name}]"
        async with gate:
            start = time.monotonic()
            try:
                response = await http.request(
                    attack.method, attack.path, content=attack.body, headers=headers
                )
            except httpx.TimeoutException:
                tally.timed_out(label)
            else:
                tally.add(label, response.status_code, response.text)
            windows.append((start, time.monotonic(), ("heavy " if attack.heavy else "") + label))

    limits = httpx.Limits(max_connections=IN_FLIGHT)
    async with httpx.AsyncClient(
        base_url=target.url, timeout=ATTACK_TIMEOUT_S, limits=limits
    ) as http:
        await asyncio.gather(*(send(http, a) for a in attacks if not a.heavy))
        for heavy in (a for a in attacks if a.heavy):
            await send(http, heavy)
    return tally, windows


def attack(target: Target, examples: int, seed: int) -> Attacked:
    start = time.monotonic()
    fuzzed = fuzz(target, examples, fixed_seed=seed, timeout=ATTACK_TIMEOUT_S)
    fuzzing = (start, time.monotonic(), f"schemathesis on {target.name} (the phase)")
    attacks = hostile_attacks(target.chat_model, target.embedding_model, target.key)
    bodies, windows = asyncio.run(send_attacks(target, attacks))
    return Attacked(fuzzed, bodies, [fuzzing, *windows], time.monotonic() - start)


def warm_up(edges: Edges) -> str:
    """A few requests of each kind, so caches and pools are as they are in service; the
    greedy stream's text, which every stream beside the attack must repeat."""
    texts = set()
    for target in (edges.serve, edges.gateway):
        client = openai.OpenAI(base_url=f"{target.url}/v1", api_key=target.key, max_retries=0)
        for _ in range(2):
            texts.add(asyncio.run(_stream_text(target)))
            client.embeddings.create(model=target.embedding_model, input=["warm", "up"] * 8)
            client.completions.create(model=target.chat_model, prompt="Warm", max_tokens=4)
    if len(texts) != 1:
        raise RuntimeError(f"the greedy stream differs between runs before any attack: {texts}")
    return texts.pop()


async def _stream_text(target: Target) -> str:
    client = openai.AsyncOpenAI(base_url=f"{target.url}/v1", api_key=target.key, max_retries=0)
    text, reason = await stream_once(client, target.chat_model)
    await client.close()
    assert reason == "length", reason
    return text


def summary(
    attacked: dict[str, Attacked],
    polls: list[tuple[float, float, int]],
    streams: Streams,
    rss: tuple[tuple[float, float], tuple[float, float]],
) -> dict[str, Any]:
    windows = [w for a in attacked.values() for w in a.windows]

    def beside(start: float, took: float) -> list[str]:
        return [label for begin, end, label in windows if begin <= start + took and end >= start]

    heavy = [p for p in polls if any(x.startswith("heavy ") for x in beside(p[0], p[1]))]
    rest = [p for p in polls if p not in heavy]
    slow = sorted((p for p in polls if p[1] >= SLOW_HEALTH_S), key=lambda p: -p[1])
    return {
        "servers": {
            name: {
                "seconds": round(a.seconds, 1),
                "requests": a.fuzz.sent + a.bodies.sent,
                "schemathesis": {"requests": a.fuzz.sent, "statuses": dict(a.fuzz.statuses)},
                "hostile_bodies": {"requests": a.bodies.sent, "statuses": dict(a.bodies.statuses)},
                "five_xx": a.fuzz.five_xx + a.bodies.five_xx,
                "not_openai_shaped": a.fuzz.not_openai + a.bodies.not_openai,
                "timeouts": a.fuzz.statuses["timeout"] + a.bodies.statuses["timeout"],
                "problems": a.fuzz.problems + a.bodies.problems,
            }
            for name, a in attacked.items()
        },
        "health": {
            "polls": len(polls),
            "max_latency_s": round(max((p[1] for p in polls), default=0.0), 3),
            "slow_polls": len(slow),
            "max_latency_s_beside_heavy": round(max((p[1] for p in heavy), default=0.0), 3),
            "max_latency_s_otherwise": round(max((p[1] for p in rest), default=0.0), 3),
            "slow_polls_otherwise": sum(p[1] >= SLOW_HEALTH_S for p in rest),
            "not_200": sum(p[2] != 200 for p in polls),
            "slowest": [
                {
                    "latency_s": round(took, 2),
                    "status": status,
                    "attacks_in_flight": beside(start, took)[:8],
                }
                for start, took, status in slow[:10]
            ],
        },
        "streams": {
            "completed": streams.completed,
            "harmed": len(streams.harmed),
            "harm": streams.harmed[:20],
        },
        "serve_rss_mb": {
            "after_warm_up": round(rss[0][0]),
            "after_suite": round(rss[1][0]),
            "kv_cache_after_warm_up": round(rss[0][1]),
            "kv_cache_after_suite": round(rss[1][1]),
            "growth": round(rss[1][0] - rss[0][0]),
            "growth_outside_kv_cache": round((rss[1][0] - rss[1][1]) - (rss[0][0] - rss[0][1])),
        },
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hostile-") as base, running_edges(
        Path(base), args.max_model_len, KV_CACHE_MEMORY, model=args.model
    ) as edges:  # fmt: skip
        expected = warm_up(edges)
        rss_warm = rss_mb(edges.serve_pid)
        context = multiprocessing.get_context("spawn")
        stop, (receive, send) = context.Event(), context.Pipe(duplex=False)
        poller = context.Process(target=poll_health, args=(f"{edges.serve.url}/health", stop, send))
        poller.start()
        streams = Streams(expected)
        beside = threading.Thread(
            target=asyncio.run, args=(run_streams([edges.serve, edges.gateway], streams),)
        )
        beside.start()
        try:
            attacked = {
                t.name: attack(t, args.examples, args.seed) for t in (edges.serve, edges.gateway)
            }
        finally:
            streams.stop.set()
            beside.join(timeout=300)
            stop.set()
            polls = receive.recv()
            poller.join(timeout=30)
        time.sleep(SETTLE_S)  # serve gives freed heap back 2 s after heavy work
        rss_after = rss_mb(edges.serve_pid)
        healthy = httpx.get(f"{edges.serve.url}/health", timeout=30).status_code
    report = summary(attacked, polls, streams, (rss_warm, rss_after))
    report["serve_health_after"] = healthy
    report["host"] = host()
    report["command"] = " ".join(["benchmarks/hostile_suite.py", *sys.argv[1:]])
    report["settings"] = {
        "model": args.model or "bundled", "max_model_len": args.max_model_len,
        "kv_cache_memory": KV_CACHE_MEMORY,
        "schemathesis_examples_per_operation_and_mode": args.examples, "seed": args.seed,
    }  # fmt: skip
    report["seconds"] = round(time.monotonic() - started, 1)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=10, help="per operation and mode")
    parser.add_argument("--seed", type=int, default=24)
    parser.add_argument("--out", type=Path, default=Path("hostile-suite.json"))
    parser.add_argument("--model", help="serve this HF folder (default: the bundled model)")
    parser.add_argument("--max-model-len", type=int, default=MAX_MODEL_LEN)
    args = parser.parse_args()
    report = run(args)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for name, server in report["servers"].items():
        print(
            f"{name}: {server['requests']} requests "
            f"(schemathesis {server['schemathesis']['requests']}, "
            f"hand-written {server['hostile_bodies']['requests']}), "
            f"{server['five_xx']} x 5xx, {server['not_openai_shaped']} not OpenAI-shaped, "
            f"{server['timeouts']} timed out, {server['seconds']} s"
        )
        for problem in server["problems"][:30]:
            print(f"  {problem}")
    health, streams, rss = report["health"], report["streams"], report["serve_rss_mb"]
    print(
        f"serve /health: {health['polls']} polls, max {health['max_latency_s']} s, "
        f"{health['slow_polls']} >= {SLOW_HEALTH_S} s, {health['not_200']} not 200; "
        f"max {health['max_latency_s_beside_heavy']} s beside the heavy attacks (items 4, 5), "
        f"{health['max_latency_s_otherwise']} s otherwise"
    )
    for poll in health["slowest"]:
        print(f"  {poll['latency_s']} s during {poll['attacks_in_flight']}")
    print(f"streams: {streams['completed']} completed, {streams['harmed']} harmed")
    print(
        f"serve RSS: {rss['after_warm_up']} MB after warm-up, {rss['after_suite']} MB after "
        f"(KV cache {rss['kv_cache_after_warm_up']} -> {rss['kv_cache_after_suite']} MB; "
        f"growth outside it {rss['growth_outside_kv_cache']} MB)"
    )
    print(f"written to {args.out} ({report['seconds']} s)")
    failed = any(s["problems"] for s in report["servers"].values()) or streams["harmed"]
    grew = rss["growth_outside_kv_cache"] > RSS_GROWTH_MB
    sys.exit(1 if failed or health["slow_polls"] or grew else 0)


if __name__ == "__main__":
    main()
