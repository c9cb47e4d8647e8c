"""Shadow traffic's cost to the primary: latency of the stable release at concurrency C with
shadow off, and with a share mirrored to a candidate that sleeps or is down.

Method (everything on 127.0.0.1, each server its own process):
- primary: `inhouse serve` of the bundled model behind `inhouse gateway` (SQLite);
- candidates: a bare ASGI responder that sleeps `--sleep` seconds before a streamed
  1-token answer (a slow candidate that costs no CPU, so the figure is the gateway's own
  cost, not two models sharing this machine's cores), and a port nobody listens on;
- conditions, switched with the release store between runs and interleaved over
  `--rounds` rounds (each condition first in one of them) so all see the same machine
  noise: shadow off, `--shadow` % to the sleeping candidate, `--shadow` % to the down one;
- each run: `--requests` non-streamed chat completions (`--max-tokens`) from C concurrent
  clients through the gateway; p50 and p99 latency per condition over all rounds, and
  their ratio to shadow off; the gateway process's CPU per request (from /proc: on a
  shared machine the robust number); the gateway's shadow counters (sent, dropped, failed).

    .venv/bin/python benchmarks/shadow_overhead.py [--rounds 3] [--requests 160]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from inhouse.gateway.config_file import load_config
from inhouse.gateway.db_open import open_database
from inhouse.gateway.keys import KeyStore, load_pepper
from inhouse.gateway.releases.store import BackendRef, NewRelease, ReleaseStore
from inhouse.http.client import Http1Client
from inhouse.launch.inhouse import inhouse_command
from inhouse.launch.ports import free_port

CHAT = "/v1/chat/completions"
SSE = (
    b'data: {"id":"s","object":"chat.completion.chunk","created":0,"model":"s","choices":'
    b'[{"index":0,"delta":{"content":"Hi"},"finish_reason":"length"}]}\n\n'
    b'data: {"id":"s","object":"chat.completion.chunk","created":0,"model":"s","choices":[],'
    b'"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}\n\ndata: [DONE]\n\n'
)


def sleeping_app(seconds: float):  # type: ignore[no-untyped-def]
    async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        if scope["path"] != "/health":
            await asyncio.sleep(seconds)
        body = b'{"status":"ok"}' if scope["path"] == "/health" else SSE
        kind = b"application/json" if scope["path"] == "/health" else b"text/event-stream"
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", kind)]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})

    return app


def wait_ready(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise TimeoutError(url)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run_load(url: str, secret: str, n: int, clients: int, max_tokens: int) -> list[float]:
    """Seconds per request of `n` requests from `clients` concurrent loops."""
    messages = [{"role": "user", "content": "Say hello."}]
    request = {"model": "smol", "max_tokens": max_tokens, "temperature": 0, "messages": messages}
    body = json.dumps(request).encode()
    client = Http1Client(url, {"authorization": f"Bearer {secret}"}, connect_timeout=10)
    left, took = n, []

    async def loop() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            start = time.perf_counter()
            async with client.post(CHAT, body) as reply:
                await reply.read()
            if reply.status != 200:
                raise RuntimeError(f"HTTP {reply.status}")
            took.append(time.perf_counter() - start)

    await asyncio.gather(*(loop() for _ in range(clients)))
    await client.aclose()
    return took


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def shadow_counts(gateway: str) -> dict[str, float]:
    counts = {}
    for line in httpx.get(f"{gateway}/metrics").text.splitlines():
        if line.startswith("inhouse:gateway_shadow_requests_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            counts[outcome] = float(line.rsplit(" ", 1)[1])
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=160, help="per condition and round")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--shadow", type=float, default=20.0, help="percent mirrored")
    parser.add_argument("--sleep", type=float, default=3.0, help="the slow candidate's delay")
    parser.add_argument("--sleeping-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sleeping_port:
        import uvicorn

        uvicorn.run(sleeping_app(args.sleep), host="127.0.0.1", port=args.sleeping_port,
                    log_level="warning", access_log=False)  # fmt: skip
        return
    with tempfile.TemporaryDirectory() as tmp:
        bench(args, Path(tmp))


def bench(args: argparse.Namespace, tmp: Path) -> None:
    serve_port, gateway_port, sleeping_port, dead_port = (free_port() for _ in range(4))
    db_url = f"sqlite:///{tmp / 'gateway.db'}"
    config = tmp / "inhouse.toml"
    config.write_text(
        f'[gateway]\nport = {gateway_port}\ndatabase = "{db_url}"\naccess_log = false\n'
        f'[[models]]\nname = "smol"\nqueue_max_depth = 256\n[[models.backends]]\nname = "q4"\n'
        f'url = "http://127.0.0.1:{serve_port}"\nmodel = "SmolLM2-135M-Instruct"\n'
    )
    serve = [*inhouse_command(), "serve", "--port", str(serve_port), "--embedding-model",
             "none", "--quantization", "q4"]  # fmt: skip
    sleeping = [sys.executable, __file__, "--sleeping-port", str(sleeping_port), "--sleep",
                str(args.sleep)]  # fmt: skip
    gateway_args = [*inhouse_command(), "gateway", "--config", str(config)]
    procs = [subprocess.Popen(serve), subprocess.Popen(sleeping), subprocess.Popen(gateway_args)]
    gateway = f"http://127.0.0.1:{gateway_port}"
    try:
        wait_ready(f"http://127.0.0.1:{serve_port}/health", 600)
        wait_ready(f"{gateway}/health", 60)
        settings = load_config(config)
        secret = KeyStore(open_database(db_url), load_pepper(settings)).create("bench")[1]
        releases = ReleaseStore(open_database(db_url))
        first = NewRelease((BackendRef("q4"),))
        candidates = {
            "sleeping": f"http://127.0.0.1:{sleeping_port}",
            "down": f"http://127.0.0.1:{dead_port}",
        }
        asyncio.run(run_load(gateway, secret, 40, args.clients, args.max_tokens))  # warm-up
        took: dict[str, list[float]] = {"off": [], "sleeping": [], "down": []}
        cpu = dict.fromkeys(took, 0.0)
        order = list(took)
        for round_index in range(args.rounds):
            shift = round_index % len(order)  # each condition runs first in some round
            for condition in order[shift:] + order[:shift]:
                state = releases.state("smol")
                if state is not None and state.candidate is not None:
                    releases.rollback("smol", "bench", None)
                if condition != "off":
                    new = NewRelease((BackendRef.parse(candidates[condition]),))
                    releases.canary("smol", first, new, 0, args.shadow, "bench", None)
                before = cpu_seconds(procs[2].pid)
                run = asyncio.run(
                    run_load(gateway, secret, args.requests, args.clients, args.max_tokens)
                )
                cpu[condition] += cpu_seconds(procs[2].pid) - before
                print(f"  round {round_index + 1} {condition:<9} p50 "
                      f"{percentile(run, 0.5) * 1000:7.1f} ms")  # fmt: skip
                took[condition] += run
        report(took, cpu, shadow_counts(gateway), args)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


def report(
    took: dict[str, list[float]], cpu: dict[str, float], counts: dict[str, float],
    args: argparse.Namespace,
) -> None:  # fmt: skip
    off50, off99 = percentile(took["off"], 0.5), percentile(took["off"], 0.99)
    print(f"c={args.clients}, shadow {args.shadow:g} %, {args.rounds} rounds × "
          f"{args.requests} requests, max_tokens={args.max_tokens}")  # fmt: skip
    print(f"{'condition':<12}{'n':>6}{'p50 ms':>10}{'p99 ms':>10}{'p50/off':>10}{'p99/off':>10}"
          f"{'gateway CPU ms/req':>20}")  # fmt: skip
    for condition, values in took.items():
        p50, p99 = percentile(values, 0.5), percentile(values, 0.99)
        per = cpu[condition] * 1000 / len(values)
        print(f"{condition:<12}{len(values):>6}{p50 * 1000:>10.1f}{p99 * 1000:>10.1f}"
              f"{p50 / off50:>10.3f}{p99 / off99:>10.3f}{per:>20.2f}")  # fmt: skip
    print("shadow copies:", json.dumps(counts))


if __name__ == "__main__":
    main()
