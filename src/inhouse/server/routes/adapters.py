"""LoRA adapters loaded and unloaded at run time, as vLLM's server does it (a plain-text
"Success: ..." body on 200). Behind the gateway only an admin reaches these."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import PlainTextResponse

from inhouse.api.errors import invalid_request, not_found
from inhouse.api.lora import LoadLoraAdapterRequest, UnloadLoraAdapterRequest
from inhouse.engine.errors import AdapterError
from inhouse.server.context import ServerContext
from inhouse.server.routes.deps import context, require_api_key

router = APIRouter(dependencies=[Depends(require_api_key)])


@router.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
async def load_lora_adapter(
    body: LoadLoraAdapterRequest, ctx: ServerContext = Depends(context)
) -> str:
    """400 for a name in use (the base's included), a folder that is not an adapter this base
    can take, or no free slot."""
    engine = ctx.require_engine()
    if body.lora_name in (ctx.model_name, ctx.config.embedding_name):
        raise invalid_request(f"{body.lora_name!r} names a model this server serves", "lora_name")
    try:
        await engine.load_adapter(body.lora_name, body.lora_path)
    except AdapterError as exc:
        raise invalid_request(str(exc), param="lora_path") from None
    return f"Success: LoRA adapter '{body.lora_name}' added successfully."


@router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
async def unload_lora_adapter(
    body: UnloadLoraAdapterRequest, ctx: ServerContext = Depends(context)
) -> str:
    """404 for a name no adapter is loaded under."""
    try:
        await ctx.require_engine().unload_adapter(body.lora_name)
    except KeyError:
        raise not_found(
            f"The LoRA adapter {body.lora_name!r} cannot be found.",
            param="lora_name",
            code="model_not_found",
        ) from None
    return f"Success: LoRA adapter '{body.lora_name}' removed successfully."
