"""The gateway config `inhouse up` runs with, built from the replicas it started."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inhouse.gateway.config import GatewayConfig
    from inhouse.launch.base import Engine
    from inhouse.launch.replicas import Replica

EMBEDDING_MODEL_NAME = "all-MiniLM-L6-v2"  # the name `inhouse serve` gives its bundled embedder


def up_config(
    chat_name: str,
    engine: Engine,
    replicas: list[Replica],
    host: str,
    port: int,
    database: str,
    embeddings: bool,
    cost: dict[str, Any] | None = None,
    max_num_seqs: int | None = None,
    routing: str = "prefix",
    adapters: tuple[str, ...] = (),
    images_per_prompt: int | None = None,
) -> GatewayConfig:
    """The gateway config `inhouse up` runs with: one backend per replica, queue policy,
    the chat model's `routing` (`gateway.affinity`), each chat backend with the
    `max_num_seqs` its replica was started with (where set), so the gateway keeps seats of
    each for interactive requests (`gateway.seats`), and the LoRA `adapters` every replica
    serves from the start, routed before the first health check lists them; a
    vision-language model's replicas (on an engine that serves images) take image parts,
    as many a request as `images_per_prompt`, the limit they were started with."""
    from inhouse.gateway.config_file import parse_config

    def backend(replica: Replica, features: list[str]) -> dict[str, object]:
        key = replica.endpoint.api_key
        return {
            "name": replica.label,
            "url": replica.url,
            "api_key": key,
            "kind": engine.kind,
            "capabilities": features,
        }

    images = images_per_prompt is not None and engine.images
    chat = [backend(r, [*engine.features, *(["vision"] if images else [])]) for r in replicas]
    if max_num_seqs:
        chat = [{**b, "max_num_seqs": max_num_seqs} for b in chat]
    if adapters:
        chat = [{**b, "adapters": list(adapters)} for b in chat]
    models = [{"name": chat_name, "backends": chat, "routing": routing}]
    if images:
        models[0]["images_per_prompt"] = images_per_prompt
    if embeddings:
        embedders = [backend(r, ["embeddings"]) for r in replicas]
        models.append({"name": EMBEDDING_MODEL_NAME, "backends": embedders})
    gateway = {"host": host, "port": port, "database": database}
    return parse_config({"gateway": gateway, "models": models, "cost": cost or {}})
