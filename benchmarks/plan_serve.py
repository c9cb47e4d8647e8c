"""`inhouse plan --cpu`'s `inhouse serve` command, started as printed, against `inhouse serve
MODEL` alone: the plan must never recommend a slower path than serve's own choice.

For each model (the bundled GGUF, and with ``--bf16-copy`` a bf16 safetensors folder made
from it) the plan's command is read from ``inhouse plan MODEL --cpu --ram RAM --emit
inhouse`` and both servers are started (an idle one sleeps). Each level then runs rounds of
``c`` short chat requests (greedy, exactly ``--new-tokens`` tokens each), the two servers
taking each round in turn, the order reversed every other round, so a drifting host weighs
on both alike. Every round's output tok/s is printed, then each level's total; the two
servers must answer with the same text (the same path gives the same tokens).

    .venv/bin/python benchmarks/plan_serve.py [--bf16-copy] [--concurrency 1,16]
        [--rounds 6] [--new-tokens 128] [--ram 4GiB]
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))

from inhouse.manifests.bundled import default_chat_model
from speculative_servers import Level, start_server
from vs_llamacpp import free_port

SERVED = "model"
PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a refrigerator works.",
    "List ten uses for a paperclip, with a sentence on each.",
    "Describe a walk through a busy market in the morning.",
]


def ask(client: httpx.Client, url: str, prompt: str, new_tokens: int) -> tuple[int, str]:
    """One short chat, greedy, exactly ``new_tokens`` tokens (ignore_eos): decode-bound."""
    body = {
        "model": SERVED,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": new_tokens,
        "ignore_eos": True,
    }
    reply = client.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    reply.raise_for_status()
    data = reply.json()
    return data["usage"]["completion_tokens"], data["choices"][0]["message"]["content"]


def drive(client: httpx.Client, url: str, prompts: list[str], new_tokens: int) -> Level:
    """One round: ``prompts`` all in flight at once."""
    level = Level()
    with ThreadPoolExecutor(len(prompts)) as pool:
        start = time.perf_counter()
        answers = list(pool.map(lambda p: ask(client, url, p, new_tokens), prompts))
        level.seconds = time.perf_counter() - start
    level.tokens = sum(n for n, _ in answers)
    level.texts = [text for _, text in answers]
    return level


def bf16_copy(gguf: Path, folder: Path) -> Path:
    """An HF folder holding ``gguf``'s weights as bf16 safetensors (config says bfloat16)."""
    import torch
    from safetensors.torch import load_file, save_file

    from inhouse.engine.models.gguf_convert import BLOCK_TYPES_FILE, convert_gguf

    convert_gguf(gguf, folder)
    (folder / BLOCK_TYPES_FILE).unlink()  # a plain HF folder: no record of GGUF blocks
    weights = folder / "model.safetensors"
    tensors = {name: t.to(torch.bfloat16) for name, t in load_file(weights).items()}
    save_file(tensors, weights, metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["torch_dtype"] = config["dtype"] = "bfloat16"
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def planned_serve_args(model: Path, ram: str) -> list[str]:
    """The arguments after `inhouse serve` in the plan's command, as printed."""
    inhouse = str(Path(sys.executable).with_name("inhouse"))
    emitted = subprocess.run(
        [inhouse, "plan", str(model), "--cpu", "--ram", ram, "--emit", "inhouse"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    lines = [line for line in emitted.splitlines() if not line.startswith("#")]
    argv = shlex.split(" ".join(line.rstrip("\\") for line in lines))
    assert argv[:2] == ["inhouse", "serve"], emitted
    return argv[2:]


def compare(model: Path, args: argparse.Namespace, tmp: Path) -> None:
    """Both servers on ``model``, every level, each round printed."""
    inhouse = str(Path(sys.executable).with_name("inhouse"))
    planned = planned_serve_args(model, args.ram)
    servers = {"serve MODEL": [str(model)], "plan's command": planned}
    print(f"\n{model.name}: plan's command: inhouse serve {shlex.join(planned)}", flush=True)
    results = {name: {c: Level() for c in args.levels} for name in servers}
    with ExitStack() as stack:
        urls = {}
        for name, serve_args in servers.items():
            port = free_port()
            command = [inhouse, "serve", *serve_args, "--port", str(port)]
            command += ["--served-model-name", SERVED, "--embedding-model", "none"]
            log = tmp / f"{model.name}-{len(urls)}.log"
            urls[name] = start_server(stack, command, port, SERVED, log)
            info = httpx.get(f"{urls[name]}/version", timeout=10).json()
            print(f"  {name}: {info['dtype']}, {info['quantization']} ({info['path_reason']})")
        client = stack.enter_context(httpx.Client())
        for c in args.levels:
            prompts = [PROMPTS[i % len(PROMPTS)] for i in range(c)]
            for number in range(args.rounds):
                order = list(servers)[:: 1 if number % 2 == 0 else -1]
                rates = {}
                for name in order:
                    level = drive(client, urls[name], prompts, args.new_tokens)
                    rates[name] = level.tok_s
                    total = results[name][c]
                    total.tokens += level.tokens
                    total.seconds += level.seconds
                    total.texts += level.texts
                line = ", ".join(f"{name} {rate:.1f}" for name, rate in rates.items())
                print(f"  c={c} round {number + 1}: {line} tok/s", flush=True)
    print(f"  {'c':>3} | {'serve MODEL':>12} | {'plan cmd':>12} | plan/alone")
    for c in args.levels:
        alone, planned_level = results["serve MODEL"][c], results["plan's command"][c]
        same = "" if alone.texts == planned_level.texts else "  (texts differ!)"
        ratio = planned_level.tok_s / alone.tok_s
        print(f"  {c:>3} | {alone.tok_s:>12.1f} | {planned_level.tok_s:>12.1f} | {ratio:.3f}{same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per level and server")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--ram", default="4GiB", help="the plan's --ram")
    parser.add_argument("--bf16-copy", action="store_true", help="also a bf16 HF folder")
    parser.add_argument("--no-gguf", action="store_true", help="skip the bundled GGUF")
    args = parser.parse_args()
    args.levels = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory(prefix="plan-serve-") as name:
        tmp = Path(name)
        models = [] if args.no_gguf else [default_chat_model()]
        if args.bf16_copy:
            models.append(bf16_copy(default_chat_model(), tmp / "SmolLM2-135M-Instruct-bf16"))
        for model in models:
            compare(model, args, tmp)


if __name__ == "__main__":
    main()
