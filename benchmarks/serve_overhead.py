"""What HTTP + SSE cost: the same workload on the engine directly and through `inhouse serve`.

One process, one engine (bundled SmolLM2, loaded once). The workload: ``--requests``
chat prompts, ``--max-tokens`` tokens each (``ignore_eos`` so every request makes the
same number), ``--concurrency`` at a time (closed loop). "direct" awaits
``AsyncEngine.generate`` on the prompt ids; "http" streams the same requests with
httpx from the same event loop to the full FastAPI app (chat template, SSE chunks,
metrics) served by uvicorn on 127.0.0.1 in a thread of this process, so the client's
parsing is charged to HTTP too. Rounds alternate direct/http to share machine noise;
the ratio of aggregate output-token throughput is printed (target: HTTP costs < 5%).

    .venv/bin/python benchmarks/serve_overhead.py [--concurrency 16] [--requests 48]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import threading
import time
import uuid

import httpx
import uvicorn

from inhouse.api.chat import ChatMessage
from inhouse.engine.config import EngineConfig
from inhouse.engine.request import EngineRequest
from inhouse.engine.sampling_params import SamplingParams
from inhouse.server.app import build_app
from inhouse.server.context import ServerConfig, ServerContext
from inhouse.server.loading import ContextLoader

MODEL = "SmolLM2-135M-Instruct"
TOPICS = ["the sea", "a library", "winter", "a robot", "mountains", "coffee", "a city", "rain"]


def prompts(count: int) -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": f"Write a short story about {TOPICS[i % len(TOPICS)]} ({i})."}]
        for i in range(count)
    ]


async def closed_loop(jobs: list, concurrency: int, run_one) -> tuple[float, int]:
    """Run ``run_one(job)`` with ``concurrency`` workers; (seconds, tokens generated)."""
    pending = list(jobs)
    tokens = 0

    async def worker() -> None:
        nonlocal tokens
        while pending:
            made = await run_one(pending.pop())  # not `tokens += await`: that reads first
            tokens += made

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start, tokens


async def direct(ctx: ServerContext, messages: list, max_tokens: int) -> int:
    engine = ctx.require_engine()
    assert ctx.renderer is not None
    prompt = ctx.renderer.render([ChatMessage.model_validate(m) for m in messages])
    ids = engine.info.tokenizer.encode(prompt, add_special_tokens=False)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    made = 0
    async for output in engine.generate(EngineRequest(uuid.uuid4().hex, ids, params)):
        made += sum(len(o.token_ids) for o in output.outputs)
    return made


async def over_http(client: httpx.AsyncClient, messages: list, max_tokens: int) -> int:
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    made = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    made = chunk["usage"]["completion_tokens"]
    return made


def start_server(ctx: ServerContext) -> tuple[uvicorn.Server, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(build_app(ctx), host="127.0.0.1", port=port, log_level="warning")
    )
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return server, f"http://127.0.0.1:{port}"


async def main_async(args: argparse.Namespace) -> None:
    config = EngineConfig(max_num_seqs=max(args.concurrency, 16), kv_cache_memory=256 * 2**20)
    ctx = ServerContext.create(ServerConfig(served_model_name=MODEL), MODEL)
    ContextLoader(config)(ctx)
    server, url = start_server(ctx)
    jobs = prompts(args.requests)
    limits = httpx.Limits(max_connections=args.concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        await closed_loop(jobs[: args.concurrency], args.concurrency, lambda m: direct(ctx, m, 8))
        await closed_loop(
            jobs[: args.concurrency], args.concurrency, lambda m: over_http(client, m, 8)
        )
        rates: dict[str, list[float]] = {"direct": [], "http": []}
        for round_ in range(args.rounds):
            for name in ("direct", "http") if round_ % 2 == 0 else ("http", "direct"):
                if name == "direct":
                    run = lambda m: direct(ctx, m, args.max_tokens)  # noqa: E731
                else:
                    run = lambda m: over_http(client, m, args.max_tokens)  # noqa: E731
                seconds, tokens = await closed_loop(jobs, args.concurrency, run)
                assert tokens == args.requests * args.max_tokens, (name, tokens)
                rates[name].append(tokens / seconds)
                print(
                    f"round {round_ + 1} {name:6s} {tokens} tokens in {seconds:6.2f} s "
                    f"= {tokens / seconds:7.1f} tok/s"
                )
    direct_rate = statistics.mean(rates["direct"])
    http_rate = statistics.mean(rates["http"])
    cost = 100 * (1 - http_rate / direct_rate)
    print(
        f"\nc={args.concurrency}, {args.requests} requests x {args.max_tokens} tokens: "
        f"direct {direct_rate:.1f} tok/s, HTTP+SSE {http_rate:.1f} tok/s, "
        f"ratio {http_rate / direct_rate:.3f} (HTTP costs {cost:.1f}%)"
    )
    server.should_exit = True
    await ctx.require_engine().shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=4)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
