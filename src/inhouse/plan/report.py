"""Render a Plan for people: rich tables and the arithmetic spelled out (each engine's
flags follow from ``inhouse.launch.emit``)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from inhouse.plan.capacity import kv_heads_per_gpu
from inhouse.plan.formats import kv_dtype_bytes
from inhouse.plan.planner import MAX_NUM_SEQS_SHARE, Plan
from inhouse.plan.units import GIB, binary, both, count

# Good engines reach this share of the bandwidth bound at batch 1 (FACTS: 70–85%).
TYPICAL_ROOFLINE_SHARE = 0.75


def _model_line(plan: Plan) -> str:
    spec = plan.model.spec
    params = f"{count(spec.total_params)} params"
    if spec.is_moe:
        params += f" ({count(spec.active_params)} active, {spec.num_experts} experts)"
    heads = f"{spec.num_attention_heads} heads / {spec.num_key_value_heads} KV heads"
    if spec.is_mla:
        heads = (
            f"{spec.num_attention_heads} heads, latent {spec.kv_lora_rank}+{spec.qk_rope_head_dim}"
        )
    window = (
        f" · window {spec.sliding_window:,} on {len(spec.sliding_layers)} layers"
        if spec.sliding_layers
        else ""
    )
    return (
        f"{params} · {spec.num_layers} layers · {heads} ({spec.attention_kind}) · "
        f"head_dim {spec.head_dim} · {spec.max_position_embeddings:,} positions{window}"
    )


def _gpu_line(plan: Plan) -> str:
    tp, memory = plan.inputs.tp, binary(plan.vram_bytes)
    if plan.gpu is None:
        return f"{tp} × {memory} (--vram) · util {plan.inputs.util:g}"
    gpu = plan.gpu
    return (
        f"{tp} × {gpu.name} ({memory}, {gpu.bandwidth_tb_s:g} TB/s, "
        f"{gpu.bf16_tflops:g} bf16 TFLOPS) · util {plan.inputs.util:g}"
    )


def _adapter_rows(plan: Plan) -> list[tuple[str, str, str]]:
    """The "adapters" row: LoRA slots × the larger engine layout's bytes a slot (none: no row)."""
    memory = plan.adapters
    if not memory.slots:
        return []
    how = (
        f"{memory.slots} slots, rank {memory.max_rank}: inhouse "
        f"{binary(memory.inhouse_slot_bytes)}, vLLM {binary(memory.vllm_slot_bytes)} a slot"
    )
    return [("adapters", binary(memory.total), how)]


def _vision_rows(plan: Plan) -> list[tuple[str, str, str]]:
    """The image encoder's weights and one prompt's encoding (a text model: no rows)."""
    vision = plan.vision
    if vision.encoder is None:
        return []
    width, height = vision.image_size
    return [
        (
            "vision encoder",
            binary(vision.weight_bytes),
            f"{count(vision.encoder.params)} params, bf16",
        ),
        (
            "image activations",
            binary(vision.activation_bytes),
            f"encoding {vision.images} image(s) of {width}×{height} at once",
        ),
    ]


def _kv_budget_formula(plan: Plan) -> str:
    return (
        "usable − weights − overhead"
        + (" − adapters" if plan.adapters.slots else "")
        + (" − vision" if plan.vision.encoder else "")
    )


def vision_line(plan: Plan) -> str:
    """What an image costs a prompt ("" for a text model)."""
    vision = plan.vision
    if vision.encoder is None:
        return ""
    width, height = vision.image_size
    return (
        f"vision: {vision.encoder.family} encoder, {count(vision.encoder.params)} params, "
        f"{vision.encoder.layers} layers · {vision.tokens_per_image:,} tokens per {width}×{height} "
        f"image · {vision.images} image(s) a prompt (--limit-mm-per-prompt) add "
        f"{vision.prompt_tokens:,} tokens to each sequence"
    )


def _memory_table(plan: Plan) -> Table:
    table = Table(title="Memory per GPU", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_column(style="dim")
    spec, kv = plan.model.spec, plan.kv_cache
    split = f" ÷ {plan.inputs.tp} GPUs" if plan.inputs.tp > 1 else ""
    usable = int(plan.vram_bytes * plan.inputs.util)
    rows = [
        ("usable", binary(usable), f"{binary(plan.vram_bytes)} × util {plan.inputs.util:g}"),
        ("weights", both(plan.weights_per_gpu), plan.weights.format_name + split),
        (
            "overhead",
            binary(plan.overhead_bytes),
            "default by model size" if plan.overhead_is_default else "--overhead",
        ),
        *_adapter_rows(plan),
        *_vision_rows(plan),
        ("free for KV cache", binary(plan.kv_budget), _kv_budget_formula(plan)),
        ("KV per token", binary(plan.kv_bytes_per_token), f"{plan.inputs.kv_dtype}, all layers"),
        ("KV per sequence", binary(plan.kv_bytes_per_sequence), f"× {plan.avg_context:,} tokens"),
        ("max concurrent sequences", f"{plan.max_concurrent:,}", "free ÷ KV per sequence"),
        (
            "largest single context",
            f"{plan.largest_context:,} tokens",
            f"model limit {spec.max_position_embeddings:,}",
        ),
        (
            "KV cache",
            f"{kv.num_tokens:,} tokens",
            f"{kv.num_blocks:,} blocks of {plan.inputs.block_size}",
        ),
        (
            "max concurrency",
            f"{kv.max_concurrency:.2f}x",
            f"at max-model-len {plan.max_model_len:,}",
        ),
    ]
    for row in rows:
        table.add_row(*row)
    return table


def _context_table(plan: Plan) -> Table:
    table = Table(title="Context × concurrency", title_justify="left")
    table.add_column("context", justify="right")
    table.add_column(f"KV/seq ({plan.inputs.kv_dtype})", justify="right")
    table.add_column("sequences", justify="right")
    with_fp8 = plan.table[0].sequences_fp8_kv is not None
    if with_fp8:
        table.add_column("with fp8 KV", justify="right")
    for row in plan.table:
        cells = [f"{row.context:,}", binary(row.kv_bytes_per_sequence), f"{row.sequences:,}"]
        if with_fp8:
            cells.append(f"{row.sequences_fp8_kv:,}")
        table.add_row(*cells, style="bold" if row.context == plan.avg_context else None)
    return table


def _roofline_lines(plan: Plan) -> list[str]:
    roof = plan.roofline
    if roof is None:
        return ["Decode roofline: give --gpu for its bandwidth and TFLOPS."]
    tp = plan.inputs.tp
    read = binary(plan.weights.read_per_step(plan.model.spec))
    kv = binary(plan.kv_bytes_per_sequence * tp)
    where = f" across {tp} GPUs" if tp > 1 else ""
    typical = roof.batch1_tokens_per_s * TYPICAL_ROOFLINE_SHARE
    return [
        f"Decode roofline, batch 1: ≤ {roof.batch1_tokens_per_s:,.0f} tokens/s "
        f"(bandwidth ÷ {read} of weights + {kv} of KV read per token{where}); "
        f"good engines reach 70–85%: ~{typical:,.0f} tokens/s.",
        f"At {roof.batch} sequences: ≤ {roof.batch_tokens_per_s:,.0f} tokens/s in aggregate "
        f"({roof.bound_at_batch}-bound).",
    ]


def _explanation(plan: Plan) -> str:
    spec = plan.model.spec
    size = f"{kv_dtype_bytes(plan.inputs.kv_dtype)} B"
    if spec.is_mla:
        latent = f"{spec.kv_lora_rank} + {spec.qk_rope_head_dim}"
        kv_formula = f"({latent}) × {spec.num_layers} layers × {size}"
    else:
        heads = kv_heads_per_gpu(spec, plan.inputs.tp)
        kv_formula = f"2 × {spec.num_layers} × {heads} KV heads × {spec.head_dim} × {size}"
    usable = _kv_budget_formula(plan).replace(
        "usable", f"{plan.vram_bytes * plan.inputs.util / GIB:.2f} GiB"
    )
    steps = [
        ("weights", plan.weights.format_name, both(plan.weights_per_gpu)),
        ("overhead", "CUDA context, activations", binary(plan.overhead_bytes)),
        *[(name, "slots × the larger layout", value) for name, value, _ in _adapter_rows(plan)],
        ("left for KV", usable, binary(plan.kv_budget)),
        ("kv_token", kv_formula, binary(plan.kv_bytes_per_token)),
        ("kv_per_seq", f"kv_token × {plan.avg_context:,}", binary(plan.kv_bytes_per_sequence)),
        ("max_concurrent", "left for KV ÷ kv_per_seq", f"{plan.max_concurrent:,} sequences"),
        ("max-num-seqs", f"{MAX_NUM_SEQS_SHARE:.0%} of that (seed 004)", f"{plan.max_num_seqs:,}"),
    ]
    lines = ["How it adds up (seed 000's arithmetic, per GPU):"]
    lines += [f"  {name:<15} {how:<40} = {value}" for name, how, value in steps]
    lines += [
        f"Weights: {plan.weights.description}.",
        "Paged KV charges only the tokens a sequence holds, so plan with the average context;",
        "--max-model-len is a policy cap on one request, not the average.",
    ]
    return "\n".join(lines)


def render(plan: Plan, console: Console, *, explain: bool = False) -> None:
    """Print the whole report."""
    spec = plan.model.spec
    console.print(f"[bold]inhouse plan[/] · {spec.name}")
    console.print(f"[dim]From the {plan.model.origin}[/]", soft_wrap=True)
    console.print(f"Model: {_model_line(plan)}", soft_wrap=True)
    if line := vision_line(plan):
        console.print(line, soft_wrap=True)
    console.print(f"GPU:   {_gpu_line(plan)}", soft_wrap=True)
    console.print("[dim]Units: GiB/MiB/KiB are binary (2^30…), GB is decimal (10^9).[/]")
    console.print(_memory_table(plan))
    verdict = "[green]fits[/]" if plan.fits else "[red]does not fit[/]"
    console.print(f"Verdict: {verdict}: {plan.reason}.", soft_wrap=True)
    console.print(_context_table(plan))
    for line in _roofline_lines(plan):
        console.print(line, soft_wrap=True)
    if explain:
        console.print(_explanation(plan), highlight=False, soft_wrap=True)
