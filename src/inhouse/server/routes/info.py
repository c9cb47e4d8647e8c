"""Operational endpoints: models, health, version, metrics, tokenize and detokenize."""

from __future__ import annotations

import hashlib

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from inhouse import __version__
from inhouse.api.errors import invalid_request
from inhouse.api.models import ModelCard, ModelList
from inhouse.api.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from inhouse.engine.fast_encode import encode
from inhouse.engine.speculative.config import SpeculativeConfig
from inhouse.server.chat_template import template_sha256
from inhouse.server.context import ServerContext
from inhouse.server.model_state import Phase
from inhouse.server.routes.deps import context, require_api_key

IDS_PER_SLICE = 65536
router = APIRouter()
authorized = APIRouter(dependencies=[Depends(require_api_key)])


@router.get("/health")
async def health(ctx: ServerContext = Depends(context)) -> JSONResponse:
    """200 when the model is loaded, 503 while it loads, if loading failed or the engine died."""
    phase = ctx.model.phase
    if phase is not Phase.READY:
        return JSONResponse({"status": phase.value, "detail": ctx.model.error}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/metrics")
async def metrics(ctx: ServerContext = Depends(context)) -> Response:
    """Prometheus exposition of the engine and request metrics."""
    return Response(ctx.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


def _speculative(config: SpeculativeConfig | None) -> dict | None:
    """The speculative config as ``--speculative-config`` spells it (None when off)."""
    return None if config is None else config.as_dict()


@router.get("/version")
async def version(ctx: ServerContext = Depends(context)) -> dict:
    """inhouse version, model identity, manifest revision and whether its files were verified,
    and hashes of tokenizer and chat template."""
    pinned = ctx.config.manifest
    info: dict = {
        "version": __version__,
        "served_model_name": ctx.model_name,
        "model_revision": pinned.revision,
        "manifest": pinned.path,
        "manifest_verified": pinned.verified,
    }
    loaded = ctx.model.loaded
    if loaded is not None:
        described = loaded.engine.info
        tokenizer_file = described.hf_folder / "tokenizer.json"
        info |= {
            "model_id": described.model_id,
            "model_source": str(described.source_path),
            "model_sha256": described.source_sha256,
            "tokenizer_sha256": _file_sha256(tokenizer_file) if tokenizer_file.is_file() else None,
            "chat_template_sha256": template_sha256(loaded.renderer.template),
            "dtype": described.dtype,
            "quantization": described.quantization,
            "kv_cache_dtype": described.kv_cache_dtype,
            "path_reason": described.path_reason,
            "device": described.device,
            "max_model_len": described.max_model_len,
            "speculative_config": _speculative(described.speculative),
        }
    if ctx.config.embedding_name is not None:
        info["embedding_model"] = ctx.config.embedding_name
    return info


def _file_sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@authorized.get("/v1/models")
async def list_models(ctx: ServerContext = Depends(context)) -> ModelList:
    """The chat model, its LoRA adapters (``parent``: the chat model), and the embedding
    model when there is one."""
    engine = ctx.require_engine()
    cards = [
        ModelCard(
            id=ctx.model_name,
            created=ctx.started_at,
            root=engine.info.model_id,
            max_model_len=engine.info.max_model_len,
        )
    ]
    cards += [
        ModelCard(
            id=adapter.name,
            created=ctx.started_at,
            root=str(adapter.path),
            parent=ctx.model_name,
            max_model_len=engine.info.max_model_len,
        )
        for adapter in engine.adapters()
    ]
    if ctx.config.embedding_name is not None:
        cards.append(ModelCard(id=ctx.config.embedding_name, created=ctx.started_at))
    return ModelList(data=cards)


@authorized.post("/tokenize", response_model=TokenizeResponse)
async def tokenize(body: TokenizeRequest, ctx: ServerContext = Depends(context)) -> Response:
    """Token ids of a prompt, or of chat messages rendered through the template (on the
    prompt workers, and so is writing the answer: 7 MiB of text is ~1.5 M ids)."""
    ctx.check_model(body.model)
    ctx.require_engine()
    if (body.prompt is None) == (body.messages is None):
        raise invalid_request("Give exactly one of 'prompt' and 'messages'.", param="prompt")
    content = await ctx.prompt_workers.run(_tokenize_json, ctx, body)
    return Response(content, media_type="application/json")


def _tokenize_json(ctx: ServerContext, body: TokenizeRequest) -> bytes:
    loaded = ctx.model.require()
    info = loaded.engine.info
    if body.messages is not None:
        tokens = loaded.renderer.token_ids(body.messages, None, body.add_generation_prompt)
    else:
        assert body.prompt is not None
        tokens = encode(info.tokenizer, body.prompt, body.add_special_tokens)
    # TokenizeResponse's fields, with the ids written a slice at a time: one model_dump_json
    # of 1.5 M ids held the GIL (and so the event loop) for 0.5 s, slices for under 0.1 s
    slices = range(0, len(tokens), IDS_PER_SLICE)
    ids = ",".join([",".join(map(str, tokens[i : i + IDS_PER_SLICE])) for i in slices])
    head = f'{{"count":{len(tokens)},"max_model_len":{info.max_model_len},"tokens":['
    return f"{head}{ids}]}}".encode()


@authorized.post("/detokenize")
async def detokenize(
    body: DetokenizeRequest, ctx: ServerContext = Depends(context)
) -> DetokenizeResponse:
    """The text of token ids."""
    ctx.check_model(body.model)
    tokenizer = ctx.require_engine().info.tokenizer
    vocab = len(tokenizer)
    if any(t >= vocab for t in body.tokens):
        raise invalid_request(f"Token ids must be in [0, {vocab}).", param="tokens")
    return DetokenizeResponse(prompt=await ctx.prompt_workers.run(tokenizer.decode, body.tokens))
