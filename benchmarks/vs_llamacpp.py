"""`inhouse serve` against llama.cpp's `llama-server` on the same GGUF, same machine, same run.

Each server runs alone, one after the other, on a loopback port; `inhouse bench sweep`
drives each with the same seeded chat prompts at the same concurrency steps (closed loop,
``--output-len`` tokens with ``ignore_eos``, greedy) and writes its ``results.json``. The
table pairs output tok/s, TTFT and TPOT (vLLM's, first token excluded) p50/p99 per step,
with ratios ours/theirs (> 1 is better for tok/s, < 1 for latencies). For ours it also
reports the time from process start to ``/health`` answering 200 and the peak resident
memory (VmHWM) of the server process.

``--long`` runs the long-prompt workloads instead: unique random documents of each of
``--long-lens`` tokens (no prefix sharing), 256 output tokens, at c=1 and c=4
(``--long-steps``), with llama.cpp given enough context per slot; one table per prompt length.

The benchmark does not build llama.cpp: pass the binary (see docs/benchmarks.md for how).

    .venv/bin/python benchmarks/vs_llamacpp.py --llama-server PATH [--steps 1,4,16]
        [--output-len 128] [--serve-args "--dtype float32 --quantization none"]
    .venv/bin/python benchmarks/vs_llamacpp.py --llama-server PATH --long \\
        [--long-lens 1000,2500] [--long-steps 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from inhouse.launch.ports import free_port
from inhouse.manifests.bundled import DEFAULT_CHAT_MODEL_NAME, default_chat_model


@dataclass(frozen=True, slots=True)
class Workload:
    """One sweep's shape: prompt and output tokens, concurrency steps."""

    input_len: int
    output_len: int
    steps: str

    @property
    def label(self) -> str:
        return f"{self.input_len}-token prompts, {self.output_len} out"


@dataclass(slots=True)
class ServerRun:
    """One server's sweeps: results per workload and concurrency, and start-up facts."""

    name: str
    steps: dict[Workload, dict[int, dict]]
    ready_s: float
    peak_rss_mb: float | None


def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> float:
    """Seconds until ``GET url`` answers 200; raises if the process dies or time runs out."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} not ready after {timeout:.0f} s")


def peak_rss_mb(pid: int) -> float | None:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


def sweep(
    base_url: str, model: str, workload: Workload, args: argparse.Namespace, out: Path
) -> dict[int, dict]:
    """Run `inhouse bench sweep` against ``base_url``; its runs keyed by concurrency."""
    inhouse = shutil.which("inhouse") or str(Path(sys.executable).with_name("inhouse"))
    command = [
        inhouse,
        "bench",
        "sweep",
        f"--base-url={base_url}",
        f"--model={model}",
        f"--steps={workload.steps}",
        f"--input-len={workload.input_len}",
        f"--output-len={workload.output_len}",
        f"--prompts-per-slot={args.prompts_per_slot}",
        f"--min-prompts={args.min_prompts}",
        "--ignore-eos",
        "--slo=ttft=60s",
        "--warmup=2",
        f"--out={out}",
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    document = json.loads((out / "results.json").read_text())
    return {run["max_concurrency"]: run["summary"] for run in document["runs"]}


def run_server(
    name: str,
    command: list[str],
    port: int,
    model: str,
    workloads: list[Workload],
    args: argparse.Namespace,
    work: Path,
) -> ServerRun:
    log = (work / f"{name}.log").open("w")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        ready = wait_ready(f"http://127.0.0.1:{port}/health", proc, args.ready_timeout)
        url = f"http://127.0.0.1:{port}/v1"
        steps = {w: sweep(url, model, w, args, work / f"{name}-{w.input_len}") for w in workloads}
        rss = peak_rss_mb(proc.pid)
    finally:
        stop(proc)
        log.close()
    return ServerRun(name, steps, ready, rss)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 15 s."""
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()


def _ms(summary: dict, metric: str, quantile: str) -> float:
    return summary[metric][quantile] * 1000


def report(ours: ServerRun, theirs: ServerRun) -> None:
    for workload in ours.steps:
        print(f"\n{workload.label}")
        report_workload(ours.steps[workload], theirs.steps[workload], ours.name, theirs.name)
    print(
        f"inhouse serve: ready in {ours.ready_s:.1f} s, peak RSS {ours.peak_rss_mb:.0f} MB; "
        f"llama-server: ready in {theirs.ready_s:.1f} s, peak RSS {theirs.peak_rss_mb:.0f} MB"
    )


def report_workload(
    ours: dict[int, dict], theirs: dict[int, dict], our_name: str, their_name: str
) -> None:
    print(
        f"{'c':>3} | {'server':<9} | {'tok/s':>7} | {'TTFT p50':>8} {'p99':>7} ms | "
        f"{'TPOT p50':>8} {'p99':>6} ms"
    )
    for c in sorted(ours):
        rows = []
        for name, steps in ((their_name, theirs), (our_name, ours)):
            s = steps[c]
            rows.append(
                (
                    s["output_throughput"],
                    _ms(s, "ttft", "p50"),
                    _ms(s, "ttft", "p99"),
                    _ms(s, "tpot", "p50"),
                    _ms(s, "tpot", "p99"),
                )
            )
            print(
                f"{c:>3} | {name:<9} | {rows[-1][0]:7.1f} | {rows[-1][1]:8.0f} "
                f"{rows[-1][2]:7.0f}    | {rows[-1][3]:8.1f} {rows[-1][4]:6.1f}"
            )
        ratio = [o / t if t else float("nan") for o, t in zip(rows[1], rows[0], strict=True)]
        print(
            f"{c:>3} | {'ratio':<9} | {ratio[0]:6.2f}x | {ratio[1]:7.2f}x {ratio[2]:6.2f}x    | "
            f"{ratio[3]:7.2f}x {ratio[4]:5.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", required=True, type=Path, help="llama-server binary")
    parser.add_argument("--gguf", type=Path, default=None, help="GGUF file (default: bundled)")
    parser.add_argument("--steps", default="1,4,16", help="concurrency steps")
    parser.add_argument("--input-len", type=int, default=64, help="prompt tokens")
    parser.add_argument("--output-len", type=int, default=128, help="output tokens (ignore_eos)")
    parser.add_argument("--prompts-per-slot", type=int, default=2)
    parser.add_argument("--min-prompts", type=int, default=4)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--serve-args", default="", help="extra `inhouse serve` flags")
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    parser.add_argument("--only", choices=("both", "ours", "theirs"), default="both")
    parser.add_argument("--long", action="store_true", help="the long-prompt workloads")
    parser.add_argument("--long-lens", default="1000,2500,6000", help="their prompt tokens")
    parser.add_argument("--long-steps", default="1,4", help="the long workloads' concurrency")
    args = parser.parse_args()
    if args.long:
        lens = [int(n) for n in args.long_lens.split(",")]
        workloads = [Workload(n, 256, args.long_steps) for n in lens]
    else:
        workloads = [Workload(args.input_len, args.output_len, args.steps)]
    slots = max(int(c) for w in workloads for c in w.steps.split(","))
    per_slot = max(1024, max(w.input_len + w.output_len + 128 for w in workloads))
    gguf = args.gguf or default_chat_model()
    model = DEFAULT_CHAT_MODEL_NAME if args.gguf is None else gguf.stem
    cpu_flags = sorted({f for f in Path("/proc/cpuinfo").read_text().split() if "avx" in f})
    print(f"GGUF {gguf.name}; {args.threads} threads; CPU flags: {' '.join(cpu_flags)}")
    print(
        f"steps {', '.join(f'{w.steps} at {w.label}' for w in workloads)} "
        f"(ignore_eos, greedy); TPOT excludes the first token"
    )
    with tempfile.TemporaryDirectory(prefix="vs-llamacpp-") as tmp:
        work = Path(tmp)
        port = free_port()
        theirs_cmd = [
            str(args.llama_server),
            "-m",
            str(gguf),
            "-t",
            str(args.threads),
            "-np",
            str(slots),
            "-c",
            str(slots * per_slot),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-a",
            model,
        ]
        ours_cmd = [
            str(Path(sys.executable).with_name("inhouse")),
            "serve",
            *([] if args.gguf is None else [str(gguf)]),
            "--port",
            str(port),
            "--served-model-name",
            model,
            *shlex.split(args.serve_args),
        ]
        runs = {}
        for name, command in (("llama.cpp", theirs_cmd), ("inhouse", ours_cmd)):
            if args.only in ("both", "theirs" if name == "llama.cpp" else "ours"):
                print(f"running {name}: {' '.join(command)}", flush=True)
                runs[name] = run_server(name, command, port, model, workloads, args, work)
        if len(runs) == 2:
            report(runs["inhouse"], runs["llama.cpp"])
        else:
            for run in runs.values():
                for workload, steps in run.steps.items():
                    rates = {c: round(s["output_throughput"], 1) for c, s in steps.items()}
                    print(run.name, workload.label, rates)
                print(run.name, f"ready {run.ready_s:.1f} s, peak RSS {run.peak_rss_mb:.0f} MB")


if __name__ == "__main__":
    main()
