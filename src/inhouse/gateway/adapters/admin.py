"""Loading and unloading LoRA adapters at run time: `POST /v1/load_lora_adapter` and
`/v1/unload_lora_adapter` in vLLM's shapes, for admin keys only (any other key gets 403).

The gateway sends the call on to every replica of the base model that does not serve the
adapter yet (a load) or to every one serving it (an unload), and routes the adapter to each
replica that loaded it, or no more to each that unloaded it. The body is vLLM's
(`lora_name`, and `lora_path` to load), with `model`, the base model's name, where the
gateway has several models. The answer is 200 when every replica succeeded; else the status
all replicas failed with, when they agree on a 4xx (a bad path), or 502; `backends` says
what each one answered.

A load through one gateway replica is known to that replica at once, and to the others
sharing the backends at their next read of the backends' `/v1/models` (`sync`)."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import asdict, dataclass
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from inhouse.api.body import json_object
from inhouse.api.errors import APIError, error_body, error_message, invalid_request, not_found
from inhouse.gateway.adapters.served import base_of
from inhouse.gateway.backends import Backend
from inhouse.gateway.config import ModelRoute, Upstream
from inhouse.gateway.exchange import UpstreamClients
from inhouse.gateway.handler import Gateway
from inhouse.gateway.keys import authenticate_admin
from inhouse.http.errors import error_response

LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
SENT = ("lora_name", "lora_path")  # what a replica is sent of the body
log = logging.getLogger("inhouse.gateway")


@dataclass(frozen=True, slots=True)
class Reply:
    """What one replica answered."""

    backend: str
    status: int  # 502 when it could not be reached
    detail: str


def install_adapter_admin(app: FastAPI, gateway: Gateway) -> None:
    """Serve the two admin routes on `app`."""

    @app.post(LOAD, include_in_schema=False)
    async def load(request: Request) -> Response:
        return await _pass_on(gateway, request, LOAD)

    @app.post(UNLOAD, include_in_schema=False)
    async def unload(request: Request) -> Response:
        return await _pass_on(gateway, request, UNLOAD)


async def _pass_on(gateway: Gateway, request: Request, path: str) -> Response:
    try:
        key = await authenticate_admin(gateway.keys, request.headers.getlist("authorization"))
        body = json_object(await request.body())
        name = _adapter_name(gateway, body)
        route, targets = _targets(gateway, body, name, loading=path == LOAD)
    except APIError as err:
        return error_response(err)
    sent = json.dumps({k: body[k] for k in SENT if k in body}).encode()
    timeout = gateway.config.request_timeout_s
    replies = await asyncio.gather(
        *(_send(gateway.upstreams, b.upstream, path, sent, timeout) for b in targets)
    )
    for backend, reply in zip(targets, replies, strict=True):
        if reply.status == 200:
            (backend.adapters.add if path == LOAD else backend.adapters.discard)(name)
            backend.adapter_changes += 1
    log.info("gateway: %s %r on %s by key %r: %s", path, name, route.name, key.name,
             ", ".join(f"{r.backend} {r.status}" for r in replies))  # fmt: skip
    return _answer(name, route, replies)


def _adapter_name(gateway: Gateway, body: dict[str, Any]) -> str:
    name = body.get("lora_name")
    if not isinstance(name, str) or not name:
        raise invalid_request("'lora_name' must be a non-empty string", "lora_name")
    if gateway.config.model(name) is not None:
        raise invalid_request(f"'{name}' is a model's name, not an adapter's", "lora_name")
    return name


def _targets(
    gateway: Gateway, body: dict[str, Any], name: str, loading: bool
) -> tuple[ModelRoute, list[Backend]]:
    """The base model and its replicas the call goes to."""
    router, asked = gateway.router, body.get("model")
    owner = base_of(router, name)
    if asked is not None:
        route = gateway.config.model(asked) if isinstance(asked, str) else None
        if route is None:
            raise not_found(f"The model '{asked}' does not exist.", "model", "model_not_found")
    elif owner is not None:
        route = owner
    elif not loading:
        raise not_found(f"No model serves the adapter '{name}'.", "lora_name", "model_not_found")
    elif len(gateway.config.models) == 1:
        route = gateway.config.models[0]
    else:
        raise invalid_request("'model' is required: the base model to load it on", "model")
    if owner is not None and owner.name != route.name:
        raise APIError(409, f"The adapter '{name}' is served by model '{owner.name}'.",
                       param="lora_name", code="adapter_conflict")  # fmt: skip
    replicas = [b for b in router.backends[route.name] if not b.draining]
    targets = [b for b in replicas if (name in b.adapters) != loading]
    if not targets and loading:
        raise invalid_request(f"Every replica of '{route.name}' serves '{name}' already.",
                              "lora_name", "adapter_loaded")  # fmt: skip
    if not targets:
        raise not_found(f"No replica of '{route.name}' serves the adapter '{name}'.",
                        "lora_name", "model_not_found")  # fmt: skip
    return route, targets


async def _send(
    upstreams: UpstreamClients, upstream: Upstream, path: str, body: bytes, timeout_s: float
) -> Reply:
    try:
        async with asyncio.timeout(timeout_s):
            async with upstreams.client(upstream).post(path, body) as reply:
                answer = await reply.read()
    except (OSError, TimeoutError) as exc:
        return Reply(upstream.name, 502, f"unreachable: {type(exc).__name__}")
    detail = answer.decode("utf-8", "replace") if reply.status == 200 else error_message(answer)
    return Reply(upstream.name, reply.status, detail.strip())


def _answer(name: str, route: ModelRoute, replies: list[Reply]) -> Response:
    shown = [asdict(r) for r in replies]
    failed = [r for r in replies if r.status != 200]
    if not failed:
        return JSONResponse({"lora_name": name, "model": route.name, "backends": shown})
    statuses = {r.status for r in failed}
    agreed = len(failed) == len(replies) and len(statuses) == 1 and max(statuses) < 500
    status = failed[0].status if agreed else 502
    message = f"{len(failed)} of {len(replies)} replicas failed: {failed[0].detail}"
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({**error_body(message, kind), "backends": shown}, status_code=status)
