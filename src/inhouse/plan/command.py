"""`inhouse plan`, the planner's command line. Exit 0: fits; 1: does not fit; 2: bad input."""

from __future__ import annotations

import typer

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
    emit: str | None = typer.Option(
        None,
        "--emit",
        help="Print only the launch command for inhouse, llama.cpp, vllm or sglang "
        "(what it lacks as # comments).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the numbers as JSON."),
    explain: bool = typer.Option(False, "--explain", help="Spell out the arithmetic."),
) -> None:
    """Compute it beforehand: weights + KV cache + overhead → sequences that fit, and flags."""
    import json
    import sys

    from rich.console import Console

    from inhouse.bundled import BundledModelMissing
    from inhouse.launch import ENGINES
    from inhouse.launch.emit import emit as emit_command
    from inhouse.plan.errors import PlanError
    from inhouse.plan.plan_json import plan_as_dict
    from inhouse.plan.planner import PlanInputs, make_plan
    from inhouse.plan.report import render
    from inhouse.plan.source import load_model
    from inhouse.plan.units import parse_bytes

    if emit is not None and emit not in ENGINES:
        known = ", ".join(ENGINES)
        typer.echo(f"inhouse plan: --emit takes one of {known}, not {emit!r}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT)
    try:
        inputs = PlanInputs(
            gpu=gpu,
            vram_bytes=parse_bytes(vram) if vram else None,
            tp=tp,
            util=util,
            overhead_bytes=parse_bytes(overhead) if overhead else None,
            avg_context=avg_context,
            max_model_len=max_model_len,
            weights=weights,
            kv_dtype=kv_dtype,
        )
        result = make_plan(load_model(model), inputs)
    except (PlanError, BundledModelMissing) as error:
        typer.echo(f"inhouse plan: {error}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    if as_json:
        typer.echo(json.dumps(plan_as_dict(result), indent=2))
    elif emit is not None and result.fits:
        typer.echo(emit_command(emit, result))
    elif result.fits:
        render(result, Console(file=sys.stdout), explain=explain)
    if not result.fits:
        typer.echo(
            f"inhouse plan: {result.model.spec.name} does not fit: {result.reason}", err=True
        )
        raise typer.Exit(EXIT_DOES_NOT_FIT)
