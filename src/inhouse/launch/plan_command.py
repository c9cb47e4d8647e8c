"""`inhouse plan`, the planner's command line. Exit 0: fits; 1: does not fit; 2: bad input.

It lives in launch, not plan, because it prints each engine's flags: launch reads plans,
plan knows no engine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from inhouse.launch import ENGINES
from inhouse.plan.adapters import DEFAULT_MAX_LORA_RANK
from inhouse.plan.errors import PlanError
from inhouse.plan.units import parse_bytes

EXIT_DOES_NOT_FIT = 1
EXIT_BAD_INPUT = 2


def plan(
    model: str | None = typer.Argument(
        None,
        help="config.json, a folder holding one, a .gguf file, or a catalogue name "
        "(e.g. llama-3.1-8b). Default: the bundled SmolLM2-135M-Instruct GGUF.",
        show_default=False,
    ),
    gpu: str | None = typer.Option(
        None, "--gpu", help="GPU model, e.g. 'RTX 4090', H100-SXM, A100-80G. Default: RTX 4090."
    ),
    vram: str | None = typer.Option(
        None, "--vram", help="Memory per GPU, e.g. 24GiB or 80GB (overrides the GPU's)."
    ),
    tp: int = typer.Option(1, "--tp", "--gpus", help="GPUs in tensor parallel."),
    util: float = typer.Option(0.9, "--util", help="Share of GPU memory the server may use."),
    overhead: str | None = typer.Option(
        None,
        "--overhead",
        help="Non-weight, non-KV memory per GPU, e.g. 2GiB. Default by model size: "
        "1 GiB < 3B params, 2 GiB < 20B, 3 GiB < 100B, else 4 GiB.",
    ),
    avg_context: int | None = typer.Option(
        None, "--avg-context", help="Average tokens per sequence (prompt + output). Default 4000."
    ),
    max_model_len: int | None = typer.Option(
        None, "--max-model-len", help="Cap on one request's tokens. Default: 2 × average, ≥ 8192."
    ),
    weights: str | None = typer.Option(
        None,
        "--weights",
        help="bf16, fp16, fp8, int8, awq, gptq, q4_0, q4_1, q8_0, q6_k, q4_k_m, q5_k_m. "
        "Default: the checkpoint's own (a GGUF file's real tensor types).",
    ),
    kv_dtype: str = typer.Option(
        "auto",
        "--kv-dtype",
        help="KV cache dtype: fp32, bf16, fp16, fp8, int8; auto follows --dtype (bf16 or fp16).",
    ),
    lora_modules: list[str] | None = typer.Option(
        None,
        "--lora-modules",
        help="A LoRA adapter the server loads, name=path (repeatable): emitted, and counted "
        "in --max-loras.",
    ),
    max_loras: int | None = typer.Option(
        None,
        "--max-loras",
        help="LoRA adapter slots, taken from the KV budget. Default: max(adapters, 4) with "
        "--lora-modules, else 0.",
    ),
    max_lora_rank: int = typer.Option(
        DEFAULT_MAX_LORA_RANK, "--max-lora-rank", help="Largest adapter rank a slot holds."
    ),
    images_per_prompt: int | None = typer.Option(
        None,
        "--images-per-prompt",
        help="A vision-language model: images one prompt may hold (emitted as vLLM's "
        "--limit-mm-per-prompt, and the gateway's images_per_prompt). Default 4.",
    ),
    image_size: str = typer.Option(
        "1024x1024",
        "--image-size",
        help="A vision-language model: the images' WIDTHxHEIGHT as clients send them; the "
        "model's processor decides the tokens.",
    ),
    emit: str | None = typer.Option(
        None,
        "--emit",
        help="Print only the launch command for inhouse, llama.cpp, vllm or sglang "
        "(what it lacks as # comments).",
    ),
    port: int | None = typer.Option(
        None,
        "--port",
        min=1,
        max=65535,
        help="--emit: the printed server listens on 127.0.0.1:PORT (default: the engine's "
        "own address).",
    ),
    profile: Path | None = typer.Option(
        None, "--profile", help="Step-time profile from `inhouse bench calibrate`: predict latency."
    ),
    cpu: bool = typer.Option(
        False, "--cpu", help="Plan for a CPU host (--ram, --cores, --mem-bandwidth), not a GPU."
    ),
    ram: str = typer.Option("16GiB", "--ram", help="--cpu: memory the server may use."),
    cores: int = typer.Option(2, "--cores", help="--cpu: cores the server's threads use."),
    mem_bandwidth: float = typer.Option(
        27.0, "--mem-bandwidth", help="--cpu: measured read bandwidth in GB/s."
    ),
    latency: bool = typer.Option(
        False,
        "--latency",
        help="Predict latency from the GPU's roofline (implied by --profile and --cpu).",
    ),
    prompt_tokens: int = typer.Option(256, "--prompt-tokens", help="Latency: mean prompt tokens."),
    output_tokens: int = typer.Option(128, "--output-tokens", help="Latency: mean output tokens."),
    len_spread: float = typer.Option(0.0, "--len-spread", help="Lengths uniform in mean·(1±s)."),
    slo_ttft: float = typer.Option(2.0, "--slo-ttft", help="Latency SLO: p99 TTFT seconds."),
    steps: str | None = typer.Option(None, "--steps", help="Concurrencies to predict: 1,2,4,8."),
    request_rate: float | None = typer.Option(
        None, "--request-rate", help="Also predict an open loop at this many requests/s."
    ),
    max_num_seqs: int | None = typer.Option(
        None, "--max-num-seqs", help="The engine's; default the profile's, else 80% of memory's."
    ),
    max_num_batched_tokens: int | None = typer.Option(
        None,
        "--max-num-batched-tokens",
        help="Token budget a step; default the profile's, else the recommended flag's.",
    ),
    chunked_prefill: bool = typer.Option(
        True, "--chunked-prefill/--no-chunked-prefill", help="Whether long prompts are split."
    ),
    scheduling_policy: str = typer.Option(
        "fcfs", "--scheduling-policy", help="The engine's: fcfs, priority or fair."
    ),
    long_prefill_token_threshold: int | None = typer.Option(
        None,
        "--long-prefill-token-threshold",
        help="The engine's cap on a step's prefill tokens under priority and fair "
        "(default 128; 0: none).",
    ),
    background_decode_rows: int | None = typer.Option(
        None,
        "--background-decode-rows",
        help="The engine's cap on a step's worse-priority decodes while better work is "
        "active, under priority and fair (default 4; 0: none).",
    ),
    batch_load: str | None = typer.Option(
        None,
        "--batch-load",
        help="Predict interactive latency under this batch job, per policy: "
        "'in-flight=16, prompt-tokens=1000, output-tokens=256[, priority=1, tenant=T]'.",
    ),
    interactive: str | None = typer.Option(
        None,
        "--interactive",
        help="With --batch-load, the interactive chats (defaults shown): 'clients=1, "
        "requests=20, prompt-tokens=64, output-tokens=64, priority=-1[, tenant=T, start=S]'.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the numbers as JSON."),
    explain: bool = typer.Option(False, "--explain", help="Spell out the arithmetic."),
) -> None:
    """Compute it beforehand: weights + KV cache + overhead → sequences that fit, and flags."""
    # rich: loaded when the command runs, not with the CLI.
    from rich.console import Console

    from inhouse.launch.emit import emit as emit_command
    from inhouse.launch.emit import flags_json, print_recommended
    from inhouse.manifests.bundled import BundledModelMissing
    from inhouse.plan.adapters import parse_lora_modules
    from inhouse.plan.latency import Traffic, parse_steps
    from inhouse.plan.latency_report import LatencyOptions, latency_section, render_latency
    from inhouse.plan.mixed import parse_batch_load, parse_interactive
    from inhouse.plan.perf_model import read_profile
    from inhouse.plan.plan_json import plan_as_dict
    from inhouse.plan.planner import PlanInputs, make_plan
    from inhouse.plan.report import render
    from inhouse.plan.scheduling import check_policy
    from inhouse.plan.source import load_model
    from inhouse.plan.step_costs import CpuTarget
    from inhouse.plan.vision import parse_image_size

    wants_latency = latency or cpu or profile is not None or batch_load is not None
    if emit is not None and emit not in ENGINES:
        known = ", ".join(ENGINES)
        typer.echo(f"inhouse plan: --emit takes one of {known}, not {emit!r}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    try:
        if interactive is not None and batch_load is None:
            raise PlanError("--interactive describes the chats beside a --batch-load; give both")
        inputs = PlanInputs(
            gpu=None if cpu else gpu,
            vram_bytes=parse_bytes(ram) if cpu else (parse_bytes(vram) if vram else None),
            tp=tp,
            util=util,
            overhead_bytes=parse_bytes(overhead) if overhead else None,
            avg_context=avg_context,
            max_model_len=max_model_len,
            weights=weights,
            kv_dtype=kv_dtype,
            cpu_cores=cores if cpu else None,
            lora_modules=tuple(parse_lora_modules(lora_modules or []).items()),
            max_loras=max_loras,
            max_lora_rank=max_lora_rank,
            images_per_prompt=images_per_prompt,
            image_size=parse_image_size(image_size),
        )
        result = make_plan(load_model(model), inputs)
        report = None
        if wants_latency and result.fits:
            report = latency_section(
                result,
                LatencyOptions(
                    traffic=Traffic(prompt_tokens, output_tokens, len_spread),
                    slo_ttft=slo_ttft,
                    max_num_seqs=max_num_seqs,
                    max_num_batched_tokens=max_num_batched_tokens,
                    chunked_prefill=chunked_prefill,
                    steps=tuple(parse_steps(steps)) if steps else None,
                    request_rate=request_rate,
                    policy=check_policy(scheduling_policy),
                    long_prefill_token_threshold=long_prefill_token_threshold,
                    background_decode_rows=background_decode_rows,
                    batch_load=parse_batch_load(batch_load) if batch_load else None,
                    interactive=parse_interactive(interactive or ""),
                ),
                profile=read_profile(profile) if profile else None,
                cpu=CpuTarget(parse_bytes(ram), cores, mem_bandwidth * 1e9) if cpu else None,
            )
    except (PlanError, BundledModelMissing) as error:
        typer.echo(f"inhouse plan: {error}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    if as_json:
        document = plan_as_dict(result)
        document["flags"].update(flags_json(result))
        document["latency"] = report.to_json() if report else None
        typer.echo(json.dumps(document, indent=2))
    elif emit is not None and result.fits:
        typer.echo(emit_command(emit, result, port))
    elif result.fits:
        console = Console(file=sys.stdout)
        render(result, console, explain=explain)
        print_recommended(result, console)
        if report is not None:
            render_latency(report, console)
    if not result.fits:
        typer.echo(
            f"inhouse plan: {result.model.spec.name} does not fit: {result.reason}", err=True
        )
        raise typer.Exit(EXIT_DOES_NOT_FIT)
