"""A step load against `inhouse up --replicas 1:3` and against one fixed replica.

Three configurations, one after another: one fixed replica; `--replicas 1:3` as it starts
by default (on a CPU host with a warm pool of two loaded, unrouted replicas: `up.autoscale`);
and `--replicas 1:3 --warm-replicas 0`, every replica above the first started cold under
the load. Each is a fresh `inhouse up` on the bundled model (`--max-num-seqs` seats a
replica, the same for all), once it is up (its warm pool loaded too), then: idle for
`--idle-s`; `--concurrency` streaming clients for `--step-s` (the step); then one client
for the rest (so a drained replica has a request running when its drain starts) until the
autoscaled stack is back to one replica, or `--after-s` for the fixed one. It reports, from
`inhouse up`'s log (each line time-stamped as it appears) and the audit table: when the
second replica was decided, started, loaded and first served, against "its start-up time
plus one window" after the step began; p99 TTFT over the step for each; the five slowest
requests with when they were sent; whether it scaled back to 1; and every failed request.

    nice -n 19 .venv/bin/python benchmarks/autoscale.py [--step-s 120] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import openai

from inhouse.gateway import metric_names
from inhouse.gateway.audit.writer import recent_rows
from inhouse.gateway.backends import sample_totals
from inhouse.gateway.db_open import open_database
from inhouse.launch.ports import free_port
from inhouse.manifests.bundled import DEFAULT_CHAT_MODEL_NAME

READY = re.compile(r"^replica (\S+) is ready on ")
WARM = re.compile(r"^replica (\S+) is warm on ")


class Stack:
    """One `inhouse up`; every log line with the wall time it appeared."""

    def __init__(self, home: Path, args: list[str], warm: int) -> None:
        self.port, self.home, self.lines = free_port(), home, []
        argv = [sys.executable, "-m", "inhouse", "up", *args, "--port", str(self.port),
                "--no-embeddings"]  # fmt: skip
        env = {**os.environ, "INHOUSE_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, env=env)  # fmt: skip
        threading.Thread(target=self._follow, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.port}"
        self.wait_for(READY, 600)
        deadline = time.monotonic() + 600
        while sum(1 for _, line in list(self.lines) if WARM.search(line)) < warm:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the warm pool did not fill: {self.lines[-30:]}")
            time.sleep(0.2)
        self.key = self.wait_for(re.compile(r"^(ih-\S+)$"), 10)[1].group(1)

    def _follow(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> tuple[float, re.Match[str]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for when, line in list(self.lines):
                if found := pattern.search(line):
                    return when, found
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        tail = "\n".join(line for _, line in self.lines[-30:])
        raise RuntimeError(f"no {pattern.pattern!r} in `inhouse up`'s log:\n{tail}")

    def seen(self, pattern: str) -> float | None:
        return next((when for when, line in self.lines if re.search(pattern, line)), None)

    def replicas(self) -> float:
        page = httpx.get(f"{self.url}/metrics", timeout=30).text
        return sample_totals(page).get(metric_names.REPLICAS, float("nan"))

    def first_served(self, backend: str) -> float | None:
        db = open_database(f"sqlite:///{self.home / 'gateway.db'}")
        try:
            rows = recent_rows(db, 100_000, "admin")
        finally:
            db.dispose()
        starts = [r["ts"] for r in rows if r["backend"] == backend]
        return min(starts) if starts else None

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=120)


async def clients(stack: Stack, count: int, until: float, ttfts: list[tuple[float, float]],
                  failed: list[str]) -> None:  # fmt: skip
    """`count` streaming clients, each sending request after request until `until`."""
    sdk = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=stack.key, max_retries=0,
                             timeout=600)  # fmt: skip

    async def client(index: int) -> None:
        n = 0
        while time.time() < until:
            n += 1
            prompt = f"Client {index}, question {n}: describe a {('red', 'blue')[n % 2]} house."
            sent, sent_at = time.monotonic(), time.time()
            try:
                stream = await sdk.chat.completions.create(
                    model=DEFAULT_CHAT_MODEL_NAME, max_tokens=32, stream=True,
                    messages=[{"role": "user", "content": prompt}],
                )  # fmt: skip
                first = None
                async for chunk in stream:
                    if first is None and chunk.choices and chunk.choices[0].delta.content:
                        first = time.monotonic() - sent
                if first is not None:
                    ttfts.append((sent_at, first))
            except openai.OpenAIError as err:
                failed.append(repr(err)[:200])

    try:
        await asyncio.gather(*(client(i) for i in range(count)))
    finally:
        await sdk.close()


def second_label(stack: Stack) -> str:
    """The label `inhouse up` gave the second replica ("-" when there was none)."""
    lines = (line for _, line in stack.lines)
    return next((m.group(1) for line in lines if (m := re.match(r"^replica (\S+:2): pid", line))),
                "-")  # fmt: skip


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def run(name: str, up_args: list[str], warm: int, args: argparse.Namespace) -> dict:
    scales = name != "fixed"
    with tempfile.TemporaryDirectory(prefix="autoscale-") as home:
        stack = Stack(Path(home), up_args, warm)
        try:
            time.sleep(args.idle_s)
            step, failed, ttfts = time.time(), [], []  # ttfts: (sent, TTFT) each
            asyncio.run(clients(stack, args.concurrency, step + args.step_s, ttfts, failed))
            after_ttfts: list[tuple[float, float]] = []
            end = time.time() + (args.after_s if not scales else 3600)
            if scales:  # one client until the stack is back to one replica
                done = threading.Event()

                def trickle() -> None:
                    while not done.is_set():
                        asyncio.run(clients(stack, 1, time.time() + 5, after_ttfts, failed))

                worker = threading.Thread(target=trickle)
                worker.start()
                while stack.replicas() > 1 and time.time() < step + args.step_s + 900:
                    time.sleep(1)
                done.set()
                worker.join()
            else:
                asyncio.run(clients(stack, 1, end, after_ttfts, failed))
            back = time.time()
            return {
                "name": name,
                "step": step,
                "back": back,
                "replicas_after": stack.replicas(),
                "ttft_p99": p99([ttft for _, ttft in ttfts]),
                "ttfts": [(sent - step, ttft) for sent, ttft in ttfts],
                "requests": len(ttfts) + len(after_ttfts),
                "failed": failed,
                "decided": stack.seen(r"autoscale: .* up 1 → \d"),
                "started": stack.seen(r"^replica \S+:2: pid"),
                "loaded": stack.seen(r"^replica \S+:2 is (warm|ready)"),
                "served": stack.first_served(second_label(stack)),
                "events": [line for _, line in stack.lines if line.startswith("autoscale: ")
                           or re.match(r"^replica \S+ is (warm|ready) .*\)$", line)],
            }  # fmt: skip
        finally:
            stack.stop()


def report(scaled: dict, args: argparse.Namespace) -> None:
    """When the second replica was decided, loaded and first served; when it was back to 1."""
    name = scaled["name"]
    if scaled["decided"] is None:
        print(f"  {name}: never scaled up")
        return
    nan = float("nan")
    at = {k: (scaled[k] or nan) - scaled["step"] for k in ("decided", "started", "loaded")}
    startup = at["loaded"] - at["started"]
    served = (scaled["served"] or nan) - scaled["step"]
    window = float(args.up_after.rstrip("s"))
    on_time = served <= startup + window + 1  # + the autoscaler's one-second tick
    verdict = "within (+1 s tick)" if on_time else "LATE or unknown"
    print(f"  {name}: second replica decided at +{at['decided']:.1f} s, started "
          f"{at['started']:+.1f} s, loaded {at['loaded']:+.1f} s (start-up {startup:.1f} s), "
          f"first served +{served:.1f} s; start-up + one window = {startup + window:.1f} s: "
          f"{verdict}")  # fmt: skip
    print(f"  {name}: back to 1 replica {scaled['back'] - scaled['step'] - args.step_s:.0f} s "
          "after the step ended")  # fmt: skip
    for line in scaled["events"]:
        print(f"    {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--step-s", type=float, default=120.0)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--after-s", type=float, default=15.0, help="fixed: load after")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--up-after", default="15s")
    parser.add_argument("--down-after", default="30s")
    parser.add_argument("--cooldown", default="15s")
    parser.add_argument("--only", default="fixed,1:3,1:3 cold", help="configurations, in order")
    args = parser.parse_args()
    seats = ["--max-num-seqs", str(args.max_num_seqs)]
    scaled = ["--replicas", "1:3", *seats, "--scale-up-after", args.up_after,
              "--scale-down-after", args.down_after, "--scale-cooldown", args.cooldown]  # fmt: skip
    configs = {
        "fixed": (["--replicas", "1", *seats], 0),
        "1:3": (scaled, 2),  # a CPU host's default: MAX - MIN warm
        "1:3 cold": ([*scaled, "--warm-replicas", "0"], 0),
    }
    runs = [run(name, *configs[name], args) for name in args.only.split(",")]
    print(f"step: idle {args.idle_s:g} s → c={args.concurrency} for {args.step_s:g} s → "
          f"1 client; --max-num-seqs {args.max_num_seqs}; windows up {args.up_after}, "
          f"down {args.down_after}, cooldown {args.cooldown}; {os.cpu_count()} CPUs")  # fmt: skip
    for r in runs:
        print(f"{r['name']:>8}: p99 TTFT over the step {r['ttft_p99']:.2f} s, "
              f"{r['requests']} requests, {len(r['failed'])} failed, "
              f"replicas at the end {r['replicas_after']:g}")  # fmt: skip
        for reason in r["failed"][:5]:
            print(f"        failed: {reason}")
        worst = sorted(r["ttfts"], key=lambda pair: pair[1])[-5:]
        shown = ", ".join(f"{ttft:.2f} s sent at +{at:.0f} s" for at, ttft in worst)
        print(f"          slowest: {shown}")
    for r in runs:
        if r["name"] != "fixed":
            report(r, args)


if __name__ == "__main__":
    main()
