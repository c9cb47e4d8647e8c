"""Record, then compare, the raw SSE bytes `inhouse serve` streams for a fixed set of greedy
requests (ids, tool-call ids and timestamps blanked), to show an engine change alters nothing.

    .venv/bin/python benchmarks/stream_fingerprint.py record streams.json
    .venv/bin/python benchmarks/stream_fingerprint.py compare streams.json

Each request is sent alone (must match byte for byte), then all of them at once (chunk
boundaries follow engine steps, so they must match too; logprob values there are compared
to 3 decimals, since a batch's float sums may differ in the last bits from run to run).
The server is started here, on a free loopback port.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from inhouse.launch.inhouse import inhouse_command
from inhouse.launch.ports import free_port

SERVE_FLAGS = [
    "--kv-cache-memory",
    "128MiB",
    "--max-model-len",
    "1024",
    "--embedding-model",
    "none",
]
MODEL = "SmolLM2-135M-Instruct"
_FLOAT = re.compile(r"-?\d+\.\d+(e-?\d+)?")
_BLANK = [
    (re.compile(rb'"id":\s*"(chatcmpl|cmpl|call)[-_][0-9a-zA-Z]+(-\d+)?"'), rb'"id":"\1-X"'),
    (re.compile(rb'"created":\s*\d+'), rb'"created":0'),
]


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
REQUESTS: list[tuple[str, dict]] = [
    ("chat", {"messages": _user("What is the capital of France?"), "max_tokens": 40}),
    ("chat", {"messages": _user("Count from one to twenty."), "max_tokens": 60, "stop": [" ten"]}),
    (
        "chat",
        {
            "messages": _user("Write a haiku about the sea."),
            "max_tokens": 30,
            "stop": ["sea", "\n"],
            "include_stop_str_in_output": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    ),
    (
        "chat",
        {"messages": _user("Name a color."), "max_tokens": 12, "logprobs": True, "top_logprobs": 3},
    ),
    ("chat", {"messages": _user("Say bonjour, naïve café, 東京 🙂."), "max_tokens": 40, "n": 2}),
    (
        "chat",
        {
            "messages": _user("Invent a person."),
            "max_tokens": 80,
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "p",
                    "schema": {
                        "type": "object",
                        "required": ["name", "age"],
                        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                    },
                },
            },
        },
    ),
    (
        "chat",
        {
            "messages": _user("Weather in Paris?"),
            "max_tokens": 60,
            "tools": [_WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
    ),
    ("chat", {"messages": _user("Weather in Oslo?"), "max_tokens": 60, "tools": [_WEATHER]}),
    ("chat", {"messages": _user("Tell me a story."), "max_tokens": 50, "stop_token_ids": [30]}),
    (
        "completions",
        {
            "prompt": "The quick brown fox",
            "max_tokens": 24,
            "echo": True,
            "logprobs": 2,
            "stream_options": {"include_usage": True},
        },
    ),
    ("completions", {"prompt": "def fib(n):", "max_tokens": 40, "stop": ["\n\n"], "min_tokens": 3}),
]


def _body(kind: str, fields: dict) -> tuple[str, dict]:
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    return path, {"model": MODEL, "stream": True, "temperature": 0, **fields}


def _normalize(raw: bytes) -> str:
    for pattern, repl in _BLANK:
        raw = pattern.sub(repl, raw)
    return raw.decode()


async def _one(client: httpx.AsyncClient, kind: str, fields: dict) -> str:
    path, body = _body(kind, fields)
    async with client.stream("POST", path, json=body) as response:
        response.raise_for_status()
        return _normalize(await response.aread())


async def _record(base_url: str) -> dict[str, list[str]]:
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
        alone = [await _one(client, kind, fields) for kind, fields in REQUESTS]
        together = await asyncio.gather(*(_one(client, k, f) for k, f in REQUESTS))
    return {"alone": alone, "together": list(together)}


def _rounded(stream: str, mode: str) -> str:
    if mode == "alone":
        return stream
    return _FLOAT.sub(lambda m: f"{float(m.group()):.3f}", stream)


def _serve() -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [*inhouse_command(), "serve", "--port", str(port), *SERVE_FLAGS]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return process, base
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            break
        time.sleep(0.5)
    process.kill()
    sys.exit("inhouse serve did not become healthy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["record", "compare"])
    parser.add_argument("path", type=Path)
    args = parser.parse_args()
    process, base = _serve()
    try:
        streams = asyncio.run(_record(base))
    finally:
        process.terminate()
        process.wait(30)
    if args.mode == "record":
        args.path.write_text(json.dumps(streams, indent=1, ensure_ascii=False))
        print(f"recorded {len(REQUESTS)} streams alone and together in {args.path}")
        return
    recorded = json.loads(args.path.read_text())
    bad = [
        f"{mode} #{i}"
        for mode in ("alone", "together")
        for i, (old, new) in enumerate(zip(recorded[mode], streams[mode], strict=True))
        if _rounded(old, mode) != _rounded(new, mode)
    ]
    print(f"{2 * len(REQUESTS) - len(bad)}/{2 * len(REQUESTS)} streams identical byte for byte")
    if bad:
        sys.exit("differ: " + ", ".join(bad))


if __name__ == "__main__":
    main()
