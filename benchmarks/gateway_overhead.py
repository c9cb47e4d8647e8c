"""Gateway overhead: the same requests direct to a backend and through `inhouse gateway`.

Method (everything on 127.0.0.1, each server its own process):
- upstreams: a static OpenAI-shaped responder (a bare ASGI app that answers every
  chat completion with the same 1-token reply, so the upstream is never the
  bottleneck), and with --real also `inhouse serve` on the bundled model with
  max_tokens=1;
- latency: N sequential non-streamed requests, direct and through the gateway
  interleaved one by one so both see the same machine noise; added latency is the
  difference of the percentiles;
- rate: a closed loop of C concurrent keep-alive clients for D seconds against the
  static upstream, direct and through the gateway; the gateway key has no limits,
  so every request does the full path (key lookup in SQLite, limits, routing,
  proxying, audit row, metrics, access log);
- CPU per request of the gateway process, of the static responder and of this
  client (from /proc and process_time): on a shared machine the robust numbers.

Requests are sent with `inhouse.http.client` (keep-alive, one write per request): httpx
costs more CPU per request than the gateway and would measure itself.

    .venv/bin/python benchmarks/gateway_overhead.py [--real] [--requests 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from inhouse.gateway.config_file import load_config
from inhouse.gateway.db_open import open_database
from inhouse.gateway.keys import KeyStore, load_pepper
from inhouse.http.client import Http1Client
from inhouse.launch.inhouse import inhouse_command
from inhouse.launch.ports import free_port

REPLY = json.dumps(
    {
        "id": "cmpl-bench",
        "object": "chat.completion",
        "created": 0,
        "model": "static",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hi"},
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
    }
).encode()
CHAT = "/v1/chat/completions"
BODY = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 1}


async def static_app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    """A bare ASGI OpenAI-shaped responder: health and a fixed 1-token completion."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    body = b'{"status":"ok"}' if scope["path"] == "/health" else REPLY
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def run_static(port: int) -> None:
    import uvicorn

    uvicorn.run(static_app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


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


async def latencies(
    targets: dict[str, tuple[str, dict[str, str], str]], n: int
) -> dict[str, list[float]]:
    """Interleaved sequential requests (each target over its own keep-alive connection);
    seconds per request per target."""
    out: dict[str, list[float]] = {name: [] for name in targets}
    clients = {
        name: (Http1Client(url, headers, connect_timeout=10), json.dumps({**BODY, "model": model}))
        for name, (url, headers, model) in targets.items()
    }
    for i in range(n + 20):
        for name, (client, body) in clients.items():
            start = time.perf_counter()
            async with client.post(CHAT, body.encode()) as reply:
                await reply.read()
            took = time.perf_counter() - start
            if reply.status != 200:
                raise RuntimeError(f"{name}: HTTP {reply.status}")
            if i >= 20:  # warm-up
                out[name].append(took)
    for client, _ in clients.values():
        await client.aclose()
    return out


async def closed_loop(
    base_url: str, headers: dict[str, str], model: str, clients: int, seconds: float
) -> tuple[float, int]:
    """Requests per second sustained by `clients` concurrent keep-alive loops, and the count.

    The loops share one `inhouse.http.client` client (a pool of keep-alive connections):
    httpx would spend more CPU per request than the gateway and measure itself.
    """
    done = 0
    errors = 0
    body = json.dumps({**BODY, "model": model}).encode()
    client = Http1Client(base_url, headers, connect_timeout=10)
    stop = time.perf_counter() + seconds

    async def loop() -> None:
        nonlocal done, errors
        while time.perf_counter() < stop:
            async with client.post(CHAT, body) as reply:
                await reply.read()
            if reply.status == 200:
                done += 1
            else:
                errors += 1

    start = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(clients)))
    elapsed = time.perf_counter() - start
    await client.aclose()
    if errors:
        print(f"  ({errors} non-200 answers from {base_url})")
    return done / elapsed, done


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured_loop(
    pid: int, base_url: str, headers: dict[str, str], model: str, args: argparse.Namespace
) -> tuple[float, float, float]:
    """Rate of a closed loop, and CPU ms per request of process `pid` and of this client."""
    before, client_before = cpu_seconds(pid), time.process_time()
    rate, count = asyncio.run(closed_loop(base_url, headers, model, args.clients, args.seconds))
    per = 1000 / max(count, 1)
    return rate, (cpu_seconds(pid) - before) * per, (time.process_time() - client_before) * per


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500, help="sequential requests per target")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients for the rate")
    parser.add_argument("--seconds", type=float, default=8.0, help="duration of each rate run")
    parser.add_argument("--real", action="store_true", help="also measure against inhouse serve")
    parser.add_argument("--static-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.static_port:
        run_static(args.static_port)
        return
    with tempfile.TemporaryDirectory() as tmp:
        bench(args, Path(tmp))


def bench(args: argparse.Namespace, tmp: Path) -> None:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        static_port, gateway_port, serve_port = free_port(), free_port(), free_port()
        procs.append(
            subprocess.Popen([sys.executable, __file__, "--static-port", str(static_port)])
        )
        static_url = f"http://127.0.0.1:{static_port}"
        models = [
            f'[[models]]\nname = "static"\n[[models.backends]]\nurl = "{static_url}"\n'
            'kind = "openai"\n'
        ]
        if args.real:
            serve = [*inhouse_command(), "serve", "--port", str(serve_port)]
            procs.append(
                subprocess.Popen(
                    [*serve, "--embedding-model", "none"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            serve_url = f"http://127.0.0.1:{serve_port}"
            models.append(
                f'[[models]]\nname = "smol"\n[[models.backends]]\nurl = "{serve_url}"\n'
                'model = "SmolLM2-135M-Instruct"\n'
            )
        config_path = tmp / "gateway.toml"
        config_path.write_text(
            f'[gateway]\nport = {gateway_port}\ndatabase = "sqlite:///{tmp / "gw.db"}"\n'
            "[health]\ninterval_s = 30\n" + "".join(models)
        )
        config = load_config(config_path)
        _, secret = KeyStore(open_database(config.database), load_pepper(config)).create("bench")
        gateway = [*inhouse_command(), "gateway", "--config", str(config_path)]
        procs.append(
            subprocess.Popen(gateway, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        wait_ready(f"{static_url}/health", 30)
        if args.real:
            wait_ready(f"{serve_url}/health", 300)
        wait_until_routable(gateway_url, secret, ["static"] + (["smol"] if args.real else []))
        pids = {"static": procs[0].pid, "gateway": procs[-1].pid}
        report(args, static_url, gateway_url, secret, serve_url if args.real else None, pids)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=20)


def wait_until_routable(gateway_url: str, secret: str, models: list[str]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            health = httpx.get(f"{gateway_url}/health", timeout=2).json()
            if all(health["models"][m]["status"] == "up" for m in models):
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.3)
    raise TimeoutError("gateway backends never came up")


def report(
    args: argparse.Namespace,
    static_url: str,
    gateway_url: str,
    secret: str,
    serve_url: str | None,
    pids: dict[str, int],
) -> None:
    auth = {"Authorization": f"Bearer {secret}"}
    pairs = [("static", static_url, "static")]
    if serve_url:
        pairs.append(("inhouse serve", serve_url, "SmolLM2-135M-Instruct"))
    print(f"Added latency, {args.requests} sequential non-streamed requests each (max_tokens=1):")
    print(
        f"{'upstream':<15}{'direct p50':>12}{'gateway p50':>13}{'added p50':>11}{'added p99':>11}"
    )
    for label, url, upstream_model in pairs:
        model = "static" if label == "static" else "smol"
        targets = {"direct": (url, {}, upstream_model), "gateway": (gateway_url, auth, model)}
        times = asyncio.run(latencies(targets, args.requests))
        d50, g50 = statistics.median(times["direct"]), statistics.median(times["gateway"])
        added99 = percentile(times["gateway"], 0.99) - percentile(times["direct"], 0.99)
        print(
            f"{label:<15}{d50 * 1e3:>10.2f}ms{g50 * 1e3:>11.2f}ms"
            f"{(g50 - d50) * 1e3:>9.2f}ms{added99 * 1e3:>9.2f}ms"
        )
    direct, static_cpu, client_direct = measured_loop(
        pids["static"], static_url, {}, "static", args
    )
    via, gateway_cpu, client_via = measured_loop(pids["gateway"], gateway_url, auth, "static", args)
    print(f"\nRate, {args.clients} concurrent clients for {args.seconds:.0f}s, static upstream:")
    print(
        f"  direct   {direct:8.0f} req/s   static responder CPU {static_cpu:.3f} ms/request"
        f"   client CPU {client_direct:.3f} ms/request"
    )
    print(
        f"  gateway  {via:8.0f} req/s   gateway CPU {gateway_cpu:.3f} ms/request"
        f"   client CPU {client_via:.3f} ms/request"
    )
    print(
        f"  gateway ceiling on one free core: {1000 / gateway_cpu:.0f} req/s"
        f" (1 / CPU per request; the measured rate is bounded by a shared machine)"
    )


if __name__ == "__main__":
    main()
