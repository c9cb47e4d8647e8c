"""Predict the latency knee before load-testing, then load-test and compare, in one command.

Starts `inhouse serve` on the bundled model (default settings) on a loopback port, then:

1. `inhouse bench calibrate` → profile.json (timed: it must stay under 2 minutes);
2. per workload, `inhouse plan --profile profile.json --json` → the predicted curve and
   the largest concurrency within the workload's SLO (p99 TTFT ≤ its seconds);
3. `inhouse bench sweep --plan plan.json --profile profile.json --ignore-eos` at steps
   from ½ to 2 × the predicted limit (dense near it, so a 20% miss shows) → the measured
   knee, with the predicted curves drawn on its PNGs;
4. prints predicted vs measured knee and TPOT at the predicted knee, with ratios.

With ``--llama-server PATH`` the same loop runs against llama.cpp's server afterwards
(`-np 16`, so the simulator is told 16 sequences a step). With ``--base-url URL`` it runs
against a server already up instead (a vLLM replica of `inhouse up --engine vllm`, its key in
``$INHOUSE_API_KEY``), told its ``--max-num-seqs``.

    .venv/bin/python benchmarks/knee_prediction.py [--workloads 256:128:2,1024:64:5]
        [--steps 1,2,4,…] [--llama-server PATH] [--base-url URL --max-num-seqs N] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from inhouse.manifests.bundled import DEFAULT_CHAT_MODEL_NAME, default_chat_model
from vs_llamacpp import free_port, stop, wait_ready


def inhouse() -> str:
    return shutil.which("inhouse") or str(Path(sys.executable).with_name("inhouse"))


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    return subprocess.run(command, check=True, text=True, **kwargs)


def calibrate(base_url: str, model: str, seqs: int, out: Path) -> float:
    started = time.monotonic()
    run(
        [inhouse(), "bench", "calibrate", f"--base-url={base_url}", f"--model={model}",
         f"--max-num-seqs={seqs}", f"--out={out}"],
    )  # fmt: skip
    return time.monotonic() - started


def steps_around(within: int) -> str:
    """Steps dense around the predicted limit, so a 20% miss shows as a different step."""
    factors = (0.5, 0.75, 0.875, 1.0, 1.125, 1.25, 1.5, 2.0)
    steps = {1, 2, 3, 4, *(max(1, round(within * f)) for f in factors)}
    return ",".join(str(c) for c in sorted(s for s in steps if s <= max(4, 2 * within)))


def workload_loop(
    base_url: str, model: str, profile: Path, workload: str, args: argparse.Namespace, out: Path
) -> dict:
    prompt, output, slo = workload.split(":")
    plan = run(
        [inhouse(), "plan", "--cpu", "--profile", str(profile), "--prompt-tokens", prompt,
         "--output-tokens", output, "--slo-ttft", slo, "--json"],
        capture_output=True,
    ).stdout  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(plan)
    latency = json.loads(plan)["latency"]
    steps = args.steps or steps_around(latency["max_concurrency_within_slo"])
    print(f"{workload}: predicted limit {latency['max_concurrency_within_slo']}; steps {steps}")
    run(
        [inhouse(), "bench", "sweep", f"--base-url={base_url}", f"--model={model}",
         f"--input-len={prompt}", f"--output-len={output}", "--ignore-eos",
         f"--steps={steps}", f"--slo=ttft={slo}s", f"--plan={out / 'plan.json'}",
         f"--profile={profile}", f"--prompts-per-slot={args.prompts_per_slot}",
         f"--min-prompts={args.min_prompts}", f"--out={out}",
         f"--seed={random.randrange(1 << 31)}"],  # no prompt an earlier sweep left cached
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    comparison = results["prediction"]["comparison"]
    return {
        "workload": f"{prompt} → {output}, p99 TTFT ≤ {slo} s",
        "within_slo_predicted": latency["max_concurrency_within_slo"],
        "within_slo_measured": results["sweep"]["last_within_slo"],
        **comparison,
    }


def show(name: str, seconds: float, rows: list[dict]) -> None:
    print(f"\n{name}: calibration {seconds:.0f} s")
    print(
        f"{'workload':<30} | {'knee pred':>9} {'meas':>5} {'ratio':>6} | "
        f"{'TPOT@knee pred':>14} {'meas':>7} {'ratio':>6} | {'last ok pred':>12} {'meas':>5}"
    )
    for r in rows:
        ratio = "—" if r["knee_ratio"] is None else f"{r['knee_ratio']:.2f}"
        measured = "—" if r["tpot_measured"] is None else f"{r['tpot_measured'] * 1000:.1f}"
        tpot_ratio = "—" if r["tpot_ratio"] is None else f"{r['tpot_ratio']:.2f}"
        print(
            f"{r['workload']:<30} | {r['predicted_knee']!s:>9} {r['measured_knee']!s:>5} "
            f"{ratio:>6} | {r['tpot_predicted'] * 1000:>11.1f} ms {measured:>7} {tpot_ratio:>6} | "
            f"{r['within_slo_predicted']!s:>12} {r['within_slo_measured']!s:>5}"
        )


def one_server(
    name: str, command: list[str], port: int, model: str, seqs: int, args: argparse.Namespace,
    out: Path,
) -> None:  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    with (out / "server.log").open("w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(f"http://127.0.0.1:{port}/health", proc, 600)
        the_loop(name, f"http://127.0.0.1:{port}", model, seqs, args, out)
    finally:
        stop(proc)


def the_loop(
    name: str, base_url: str, model: str, seqs: int, args: argparse.Namespace, out: Path
) -> None:
    """Calibrate the server once, then predict and sweep each workload."""
    out.mkdir(parents=True, exist_ok=True)
    profile = out / "profile.json"
    seconds = calibrate(base_url, model, seqs, profile)
    rows = [
        workload_loop(base_url, model, profile, w, args, out / w.replace(":", "_"))
        for w in args.workloads.split(",")
    ]
    show(name, seconds, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", help="default: ½ … 2 × the predicted limit, see steps_around")
    parser.add_argument(
        "--workloads",
        default="256:128:2,1024:64:5",
        help="prompt:output:SLO (p99 TTFT seconds) per workload, comma-separated",
    )
    parser.add_argument("--prompts-per-slot", type=int, default=1)
    parser.add_argument("--min-prompts", type=int, default=2)
    parser.add_argument("--llama-server", help="also run the loop against this llama-server")
    parser.add_argument("--only-llama-server", action="store_true", help="skip inhouse serve")
    parser.add_argument("--base-url", help="a server already up: run the loop on it alone")
    parser.add_argument("--model", default=DEFAULT_CHAT_MODEL_NAME, help="with --base-url")
    parser.add_argument("--max-num-seqs", type=int, default=8, help="with --base-url")
    parser.add_argument("--out", type=Path, help="keep results here (default: a temp dir)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="knee-"))
    started = time.monotonic()
    print(f"load average at start: {os.getloadavg()}; results under {out}")
    if args.base_url:
        the_loop(
            f"server at {args.base_url}", args.base_url, args.model, args.max_num_seqs, args, out
        )
        print(f"\nload average at end: {os.getloadavg()}; took {time.monotonic() - started:.0f} s")
        return
    port = free_port()
    ours = [inhouse(), "serve", "--port", str(port), "--embedding-model", "none"]
    if not args.only_llama_server:
        one_server("inhouse serve", ours, port, DEFAULT_CHAT_MODEL_NAME, 64, args, out / "inhouse")
    if args.llama_server:
        port = free_port()
        theirs = [
            args.llama_server, "-m", str(default_chat_model()), "--port", str(port), "-t", "2",
            "-np", "16", "-c", "32768", "--host", "127.0.0.1", "--alias", DEFAULT_CHAT_MODEL_NAME,
        ]  # fmt: skip
        one_server("llama.cpp", theirs, port, DEFAULT_CHAT_MODEL_NAME, 16, args, out / "llamacpp")
    print(f"\nload average at end: {os.getloadavg()}; took {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
