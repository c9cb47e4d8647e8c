"""``inhouse serve``: the OpenAI-compatible server over the engine, flags in vLLM's spelling.

Heavy imports (torch, the engine, uvicorn) happen inside the command, so the CLI stays
fast for other subcommands.
"""

from __future__ import annotations

import gc
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from inhouse.http.body_limit import DEFAULT_MAX_BODY_BYTES, IMAGE_BODY_BYTES
from inhouse.manifests.command import checked_manifest
from inhouse.plan.units import parse_bytes
from inhouse.plan.vision import (
    DEFAULT_IMAGES_PER_PROMPT,
    parse_image_limit,
    served_vision_folder,
)
from inhouse.server.model_state import Phase

if TYPE_CHECKING:
    from inhouse.server.context import ServerContext

DEFAULT_EMBEDDING_NAME = "all-MiniLM-L6-v2"
EXIT_LOAD_FAILED = 1  # the chat model did not load; one line says why
EXIT_NOT_STARTED = 3  # uvicorn's own code for a server that could not start


def serve_command(
    model: Annotated[
        str | None, typer.Argument(help="HF folder or GGUF file; omit for bundled SmolLM2.")
    ] = None,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind.")] = 8000,
    served_model_name: Annotated[
        str | None, typer.Option(help="Model name clients use (default: the model id).")
    ] = None,
    max_model_len: Annotated[int | None, typer.Option(help="Longest prompt + output.")] = None,
    max_num_seqs: Annotated[int, typer.Option(help="Most sequences per batch.")] = 64,
    max_num_batched_tokens: Annotated[int, typer.Option(help="Token budget per step.")] = 2048,
    kv_cache_memory: Annotated[
        str | None, typer.Option(help="KV cache budget, e.g. 256MiB (default: share of free).")
    ] = None,
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16 or float16.")] = "auto",
    quantization: Annotated[
        str,
        typer.Option(
            help="Weight format: auto (fp16 weights when --dtype auto gives float32 on a "
            "CPU), none, fp16, or q8/q4 (our C++ CPU kernels, not batch-invariant yet).",
        ),
    ] = "auto",
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    kv_cache_dtype: Annotated[
        str,
        typer.Option(
            help="KV cache dtype: auto (float16 under q8/q4, else the activations') or int8 "
            "(a scale per token and KV head; q8/q4 weights on a CPU): half the bytes a long "
            "context's attention reads.",
        ),
    ] = "auto",
    enable_prefix_caching: Annotated[
        bool, typer.Option("--enable-prefix-caching/--no-enable-prefix-caching")
    ] = True,
    api_key: Annotated[
        str | None, typer.Option(envvar="INHOUSE_API_KEY", help="Require this bearer key.")
    ] = None,
    chat_template: Annotated[
        str | None, typer.Option(help="Chat template: a Jinja file or the template text.")
    ] = None,
    embedding_model: Annotated[
        str | None, typer.Option(help="Embedding model folder, or 'none' (default: MiniLM).")
    ] = None,
    max_request_body: Annotated[
        int | None,
        typer.Option(
            help="Largest request body in bytes (413 above; default 8 MiB, 20 MiB for a "
            "vision model: four photos as base64 data URIs).",
        ),
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Engine seed for unseeded requests.")] = None,
    manifest: Annotated[
        Path | None,
        typer.Option(
            help="Model manifest (inhouse models lock): refuse to start unless every file "
            "matches; gives the model, name, dtype and quantization unless flags do."
        ),
    ] = None,
    kv_reserve: Annotated[
        float,
        typer.Option(
            help="Share of the KV blocks running requests still need to reach max_tokens that "
            "admission keeps free (1: no preemption; 0: admit whenever the prompt fits).",
        ),
    ] = 1.0,
    scheduling_policy: Annotated[
        str,
        typer.Option(
            help="fcfs (arrival order), priority (by the request's priority field, lower "
            "first, then arrival) or fair (priority, then an equal share of tokens between "
            "tenants, a tenant being a request's cache_salt).",
        ),
    ] = "fcfs",
    long_prefill_token_threshold: Annotated[
        int | None,
        typer.Option(
            help="Under priority and fair, the most prefill tokens one step gives while more "
            "than one request wants tokens (default 128; 0: the whole step budget).",
        ),
    ] = None,
    background_decode_rows: Annotated[
        int | None,
        typer.Option(
            help="Under priority and fair, the most decodes of a worse priority one step runs "
            "while better-priority work is active, in turns (default 4; 0: no cap); "
            "between interactive requests one, and no worse prefill.",
        ),
    ] = None,
    speculative_config: Annotated[
        str | None,
        typer.Option(
            help='Speculative decoding, as JSON in vLLM\'s spelling: {"method": "ngram", '
            '"num_speculative_tokens": 16, "prompt_lookup_max": 16, "prompt_lookup_min": 2} '
            '(prompt lookup), {"method": "suffix"} (prompt lookup and earlier replies) or '
            '{"model": PATH, "num_speculative_tokens": 4} (a draft model with the same '
            "tokenizer).",
        ),
    ] = None,
    lora_modules: Annotated[
        list[str] | None,
        typer.Option(
            help="A PEFT LoRA adapter served beside the base, as name=path (or vLLM's JSON "
            '{"name": ..., "path": ...}); repeat the flag for more. Requests name it as model.',
        ),
    ] = None,
    max_loras: Annotated[
        int | None,
        typer.Option(
            help="Adapter slots, loaded at start or at run time (POST /v1/load_lora_adapter); "
            "default: as many as --lora-modules, at least 4 once one is given, else 0.",
        ),
    ] = None,
    max_lora_rank: Annotated[
        int | None, typer.Option(help="Highest adapter rank a slot holds (default 16, vLLM's).")
    ] = None,
    limit_mm_per_prompt: Annotated[
        str,
        typer.Option(
            help='A vision model\'s images a prompt may hold, as vLLM takes it: {"image": 4}.'
        ),
    ] = json.dumps({"image": DEFAULT_IMAGES_PER_PROMPT}),
    allowed_media_domains: Annotated[
        list[str] | None,
        typer.Option(
            help="A host whose http(s) image URLs a vision model fetches (repeat for more); "
            "by default only data URIs are read.",
        ),
    ] = None,
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API."""
    pinned = None  # checked before the heavy imports: a mismatch exits at once
    if manifest is not None:
        if model is not None:
            raise typer.BadParameter("give MODEL or --manifest, not both (the manifest names it)")
        pinned = checked_manifest(manifest)
        model = str(pinned.source_path())
        served_model_name = served_model_name or pinned.name
        dtype = pinned.dtype if dtype == "auto" else dtype
        quantization = pinned.quantization if quantization == "auto" else quantization
        pinned_loras = [f"{a.name}={a.source_path()}" for a in pinned.adapters]  # verified too
        lora_modules = [*(lora_modules or []), *pinned_loras]
    # Loaded when the command runs, not with the CLI: the engine's config, then (once the
    # flags are good) uvicorn and the app, with torch, transformers and FastAPI.
    from inhouse.engine.config import DEFAULT_MAX_LORA_RANK, EngineConfig
    from inhouse.engine.lora.modules import parse_lora_modules
    from inhouse.engine.speculative.config import SpeculativeConfig
    from inhouse.manifests.bundled import default_embedding_model

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        engine_config = EngineConfig(
            model=model,
            dtype=dtype,
            quantization=quantization,
            device=device,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            kv_cache_memory=parse_bytes(kv_cache_memory) if kv_cache_memory else None,
            enable_prefix_caching=enable_prefix_caching,
            seed=seed,
            kv_reserve=kv_reserve,
            scheduling_policy=scheduling_policy,
            long_prefill_token_threshold=long_prefill_token_threshold,
            background_decode_rows=background_decode_rows,
            kv_cache_dtype=kv_cache_dtype,
            speculative=SpeculativeConfig.parse(speculative_config) if speculative_config else None,
            lora_modules=parse_lora_modules(lora_modules or []),
            max_loras=max_loras,
            max_lora_rank=DEFAULT_MAX_LORA_RANK if max_lora_rank is None else max_lora_rank,
        )
        images_per_prompt = parse_image_limit(limit_mm_per_prompt)
    except ValueError as err:  # a bad flag (EngineConfigError too): one line, exit 2
        raise typer.BadParameter(str(err)) from None
    gc.disable()  # the flags are good; on until the model is loaded (see _then_gc_on)
    import uvicorn

    from inhouse.server.app import build_app
    from inhouse.server.context import ManifestStatus, ServerConfig, ServerContext
    from inhouse.server.loading import ContextLoader

    if embedding_model == "none":
        embedding_path, embedding_name = None, None
    elif embedding_model is None:
        embedding_path, embedding_name = default_embedding_model(), DEFAULT_EMBEDDING_NAME
    else:
        embedding_path, embedding_name = Path(embedding_model), Path(embedding_model).name
    name = served_model_name or _default_model_name(model)
    config = ServerConfig(
        served_model_name=name,
        api_key=api_key,
        chat_template=chat_template,
        max_body_bytes=max_request_body or default_body_cap(model),
        embedding_model=embedding_path,
        embedding_model_name=embedding_name,
        manifest=ManifestStatus.of(pinned),
        images_per_prompt=images_per_prompt,
        allowed_media_domains=frozenset(h.lower() for h in allowed_media_domains or []),
    )
    ctx = ServerContext.create(config, name)
    app = build_app(ctx, _then_gc_on(ContextLoader(engine_config)))
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)
    )
    threading.Thread(target=_announce, args=(ctx, server, host, port), daemon=True).start()
    server.run()
    if ctx.model.phase is Phase.FAILED:  # a server that can never be ready does not stay up
        raise typer.Exit(EXIT_LOAD_FAILED)
    if not server.started:  # uvicorn said why (the port is taken, say)
        raise typer.Exit(EXIT_NOT_STARTED)


def _then_gc_on(load: Callable[[ServerContext], None]) -> Callable[[ServerContext], None]:
    """``load``, then the cyclic GC back on, with everything start-up built frozen out of it.

    Importing torch and transformers and loading both models builds ~430k long-lived
    objects and frees almost none of them: with the GC on, its ~1000 collections over
    them took ~1 s of a ~10 s start on a 2-core CPU, and a full collection afterwards
    ~0.5 s, a stall a request would pay. So serve_command turns it off for start-up;
    ``gc.freeze`` leaves those objects out of every later collection (the few thousand
    cycles start-up left unreachable stay allocated: no collection at start).
    """

    def run(ctx: ServerContext) -> None:
        try:
            load(ctx)
        finally:
            gc.freeze()
            gc.enable()

    return run


def default_body_cap(model: str | None) -> int:
    """serve's body cap without --max-request-body: room for images where the model reads
    them."""
    return IMAGE_BODY_BYTES if served_vision_folder(model) else DEFAULT_MAX_BODY_BYTES


def _default_model_name(model: str | None) -> str:
    # Loaded when the command runs, not with the CLI (start-up time).
    from inhouse.manifests.bundled import DEFAULT_CHAT_MODEL_NAME

    if model is None:
        return DEFAULT_CHAT_MODEL_NAME
    path = Path(model)
    return path.stem if path.suffix == ".gguf" else path.name


def _announce(ctx, server, host: str, port: int) -> None:
    """Print the capacity table and the URL once the model is loaded; if it failed to load,
    the reason, and stop the server."""
    typer.echo(f"inhouse serve: loading {ctx.model_name} ... (/health answers 503 until ready)")
    if ctx.model.wait() is Phase.FAILED:
        typer.echo(f"inhouse serve: {ctx.model.error}", err=True)
        server.should_exit = True
        return
    # Loaded already by serve_command; local like its imports there.
    from inhouse.engine.config import describe_scheduling
    from inhouse.engine.lora.slots import describe_adapters
    from inhouse.engine.models.precision import WEIGHT_FORMATS

    engine = ctx.model.require().engine
    info = engine.info
    budget = info.budget
    rows = [
        ("model", ctx.model_name),
        ("dtype", f"{info.dtype} (weights {WEIGHT_FORMATS[info.quantization]})"),
        ("why", info.path_reason),
        ("manifest", ctx.config.manifest.describe()),
        ("max model len", f"{budget.max_model_len} tokens"),
        (
            "KV cache",
            f"{budget.kv_cache_memory / 2**20:.1f} MiB {info.kv_cache_dtype} ({budget.reason})",
        ),
        ("KV blocks", f"{budget.num_blocks} x {budget.block_size} tokens"),
        ("KV tokens", f"{budget.num_tokens}"),
        ("max concurrency", f"{budget.max_concurrency:.2f}x at {budget.max_model_len} tokens"),
        ("speculative", info.speculative.describe() if info.speculative else "off"),
        ("scheduling", describe_scheduling(engine.core.config)),
        ("LoRA adapters", describe_adapters(engine.core.adapters)),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        typer.echo(f"  {key:<{width}}  {value}")
    typer.echo(f"Serving on http://{host}:{port}/v1  (OpenAI-compatible; Ctrl-C to stop)")
