"""Predict interactive TTFT under a batch load, then measure it, in one command (issue 27).

Starts `inhouse serve` on the bundled model on a loopback port (``--serve-args`` adds flags,
e.g. ``--scheduling-policy priority`` where the engine has it), then:

1. `inhouse bench calibrate` → profile.json (``--profile FILE`` reuses one instead);
2. `inhouse plan --profile … --batch-load … --interactive … --json` → the prediction for
   every policy; the chats start at ``--start-factor`` × the predicted ramp (the batch's
   first wave all decoding), and the plan is asked again with that start;
3. `inhouse bench run` of the chats alone (one client) → the idle server's TTFT;
4. `inhouse bench run --ignore-eos --mix chats --mix batch` → the two classes measured
   together, the chats delayed as in the plan;
5. prints predicted vs measured interactive TTFT p50/p99 (and their ratio), TPOT and the
   batch's output rate, for the policy the server ran.

    .venv/bin/python benchmarks/mixed_prediction.py [--batch 16:1000:256] [--chats 20:40:16]
        [--policy fcfs] [--serve-args '--scheduling-policy priority'] [--profile FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from inhouse.manifests.bundled import DEFAULT_CHAT_MODEL_NAME
from knee_prediction import calibrate, inhouse, run
from vs_llamacpp import free_port, wait_ready

KEY = "mixed-prediction-key"


def plan(profile: Path, batch: str, chats: str, policy: str) -> dict:
    """`inhouse plan`'s mixed section for these classes."""
    document = run(
        [inhouse(), "plan", "--cpu", "--profile", str(profile), "--steps", "1",
         "--scheduling-policy", policy, "--batch-load", batch, "--interactive", chats, "--json"],
        capture_output=True,
    ).stdout  # fmt: skip
    return json.loads(document)["latency"]["mixed"]


def bench(base_url: str, out: Path, *args: str) -> dict:
    """`inhouse bench run …` → its results document."""
    run(
        [inhouse(), "bench", "run", f"--base-url={base_url}", f"--model={DEFAULT_CHAT_MODEL_NAME}",
         "--ignore-eos", "--warmup=0", f"--out={out}", *args],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return json.loads((out / "results.json").read_text())


def measure(base_url: str, mixed: dict, chats: tuple[int, int, int], out: Path) -> dict:
    """The idle chats, then chats and batch together; each run's summaries."""
    requests, prompt, output = chats
    idle = bench(
        base_url, out / "idle", "--max-concurrency=1", f"--num-prompts={requests}",
        f"--input-len={prompt}", f"--output-len={output}",
    )  # fmt: skip
    i, b = mixed["interactive"], mixed["batch"]
    together = bench(
        base_url, out / "mix",
        "--mix", f"chat: max-concurrency={i['clients']}, input-len={prompt}, "
        f"output-len={output}, num-prompts={requests}, priority={i['priority']}, "
        f"cache-salt={i['tenant']}, delay={mixed['interactive_start_s']:g}",
        "--mix", f"batch: max-concurrency={b['in_flight']}, input-len={b['prompt_tokens']}, "
        f"output-len={b['output_tokens']}, priority={b['priority']}, cache-salt={b['tenant']}",
    )  # fmt: skip
    runs = {r["class"]["name"]: r for r in together["runs"]}
    chat = runs["chat"]["summary"]
    window = (mixed["interactive_start_s"], mixed["interactive_start_s"] + chat["duration"])
    return {
        "idle": idle["runs"][0]["summary"],
        "chat": chat,
        "batch": runs["batch"]["summary"],
        "batch_in_window": tokens_per_s(runs["batch"]["requests"], window),
    }


def tokens_per_s(requests: list[dict], window: tuple[float, float]) -> float:
    """Tokens/s streamed in `window` (seconds since the class began), one token a chunk
    (`inhouse serve` streams one token an event): the batch's rate while the chats ran, as
    the plan predicts it."""
    low, high = window
    chunks = sum(low <= r["start"] + t <= high for r in requests for t in r["chunk_times"])
    return chunks / (high - low)


def show(point: dict, measured: dict, policy: str, start: float) -> None:
    chat, idle, batch = measured["chat"], measured["idle"], measured["batch"]
    rows = [
        ("interactive TTFT p50", point["ttft_p50"], chat["ttft"]["p50"], "s"),
        ("interactive TTFT p99", point["ttft_p99"], chat["ttft"]["p99"], "s"),
        ("interactive TPOT p50", point["tpot_p50"], chat["tpot"]["p50"], "s"),
        ("idle TTFT p99", point["idle_ttft_p99"], idle["ttft"]["p99"], "s"),
        ("batch tok/s, chats on", point["batch_tokens_per_s"], measured["batch_in_window"], ""),
    ]
    print(f"\npolicy {policy}; chats from {start:g} s after the batch started")
    print(f"{'':<22} {'predicted':>10} {'measured':>10} {'pred/meas':>9}")
    for name, predicted, got, unit in rows:
        ratio = predicted / got if got else float("nan")
        print(f"{name:<22} {predicted:>9.3f}{unit} {got:>9.3f}{unit} {ratio:>9.2f}")
    failed = chat["failed"] + batch["failed"] + idle["failed"]
    print(f"completed: chats {chat['completed']}, batch {batch['completed']}; failed {failed}")
    whole = batch["output_throughput"]
    print(f"batch output tok/s over its whole run (ramp and drain too): {whole:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="16:1000:256", help="in_flight:prompt:output")
    parser.add_argument("--chats", default="20:40:16", help="requests:prompt:output")
    parser.add_argument("--policy", default="fcfs", help="the policy the server runs")
    parser.add_argument("--serve-args", default="", help="extra `inhouse serve` flags")
    parser.add_argument("--kv-cache-memory", default="1GiB")
    parser.add_argument("--start-factor", type=float, default=1.5)
    parser.add_argument("--profile", type=Path, help="reuse this profile, skip calibrating")
    parser.add_argument("--out", type=Path, help="keep results here (default: a temp dir)")
    parser.add_argument(
        "--base-url", help="measure this running server (its key in INHOUSE_API_KEY) instead"
    )
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="mixed-"))
    out.mkdir(parents=True, exist_ok=True)
    in_flight, b_prompt, b_output = (int(x) for x in args.batch.split(":"))
    chats = tuple(int(x) for x in args.chats.split(":"))
    batch = f"in-flight={in_flight}, prompt-tokens={b_prompt}, output-tokens={b_output}"
    chat_spec = f"requests={chats[0]}, prompt-tokens={chats[1]}, output-tokens={chats[2]}"
    started = time.monotonic()
    os.environ.setdefault("INHOUSE_API_KEY", KEY)  # the server's key; every bench command sends it
    print(f"load average at start: {os.getloadavg()}; results under {out}")
    if args.base_url:
        measured, mixed, start = loop(args.base_url, args, out, batch, chat_spec, chats)
    else:
        measured, mixed, start = serve_and_loop(args, out, batch, chat_spec, chats)
    point = next(p for p in mixed["policies"] if p["policy"] == args.policy)
    show(point, measured, args.policy, start)
    print(f"\nload average at end: {os.getloadavg()}; took {time.monotonic() - started:.0f} s")


def serve_and_loop(
    args: argparse.Namespace, out: Path, batch: str, chat_spec: str, chats: tuple
) -> tuple[dict, dict, float]:
    """Start `inhouse serve`, run `loop` against it, stop it."""
    port = free_port()
    command = [
        inhouse(), "serve", "--port", str(port), "--embedding-model", "none",
        "--max-model-len", "2048", "--kv-cache-memory", args.kv_cache_memory,
        *shlex.split(args.serve_args),
    ]  # fmt: skip
    with (out / "server.log").open("w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(f"http://127.0.0.1:{port}/health", proc, 600)
        return loop(f"http://127.0.0.1:{port}", args, out, batch, chat_spec, chats)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def loop(
    base_url: str, args: argparse.Namespace, out: Path, batch: str, chat_spec: str, chats: tuple
) -> tuple[dict, dict, float]:
    """Calibrate (unless given a profile), predict, measure: (measured, plan, chats' start)."""
    profile = args.profile
    if profile is None:
        profile = out / "profile.json"
        seconds = calibrate(base_url, DEFAULT_CHAT_MODEL_NAME, 64, profile)
        print(f"calibrated in {seconds:.0f} s")
    ramp = plan(profile, batch, chat_spec, args.policy)["interactive_start_s"]
    start = round(ramp * args.start_factor)
    mixed = plan(profile, batch, f"{chat_spec}, start={start}", args.policy)
    (out / "mixed_plan.json").write_text(json.dumps(mixed, indent=1))
    return measure(base_url, mixed, chats, out), mixed, start


if __name__ == "__main__":
    main()
