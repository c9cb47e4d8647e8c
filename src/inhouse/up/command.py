"""`inhouse up`: N replicas of an engine on private loopback ports behind the gateway, or
MIN to MAX of them started and drained on load (`up.autoscale`).

With `--gpu`/`--vram` the plan decides every engine flag; without, each engine sizes
itself for this machine (`--max-model-len` and `--max-num-seqs` still apply). Each
replica gets a random key that only the gateway knows (passed through the environment
where the engine reads one, so it never shows in `ps`), or `$INHOUSE_UP_REPLICA_KEY` when
set, so an operator can reach one replica directly (`inhouse bench calibrate` on one
engine, not the gateway's mix of them); the first start creates an
`admin` key and prints its secret once. Ctrl-C stops the gateway, then every replica.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import sys
import threading
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from inhouse.launch import ENGINES
from inhouse.launch.base import Endpoint, Engine, EngineMissing, Health, LaunchSettings
from inhouse.launch.ports import free_port
from inhouse.manifests.command import checked_manifest
from inhouse.plan.errors import PlanError
from inhouse.up.settings import (
    EXIT_NO_REPLICA,
    AdapterOptions,
    launch_settings,
    plan_inputs,
    safetensors_settings,
)

if TYPE_CHECKING:
    import uvicorn

    from inhouse.gateway.config import GatewayConfig
    from inhouse.launch.replicas import Replica

# The imports inside functions load when `inhouse up` runs, not with every CLI command:
# `inhouse --help` imports this module, and they are the gateway, the planner, httpx and
# SQLAlchemy (start-up time).

__all__ = ["ensure_admin_key", "up_command"]

ADMIN_KEY = "admin"
EXIT_BAD_INPUT = 2
WATCH_INTERVAL_S = 1.0
REPLICA_KEY_ENV = "INHOUSE_UP_REPLICA_KEY"  # the stable replicas' key when set (a canary: its own)


def up_command(
    model: Annotated[
        str | None,
        typer.Argument(help="GGUF file, HF folder or catalogue name; omit for bundled SmolLM2."),
    ] = None,
    engine: Annotated[str, typer.Option(help="inhouse, llama.cpp, vllm or sglang.")] = "inhouse",
    replicas: Annotated[
        str, typer.Option(help="Engine processes behind the gateway: N, or MIN:MAX to scale.")
    ] = "1",
    host: Annotated[str, typer.Option(help="Gateway address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Gateway port.")] = 8000,
    database: Annotated[
        str | None, typer.Option(help="SQLAlchemy URL (default: SQLite in $INHOUSE_HOME).")
    ] = None,
    embeddings: Annotated[
        bool, typer.Option(help="Also serve the bundled embedding model (inhouse engine).")
    ] = True,
    gpu: Annotated[str | None, typer.Option(help="Plan for this GPU (as inhouse plan).")] = None,
    vram: Annotated[str | None, typer.Option(help="Plan for this memory per GPU.")] = None,
    tp: Annotated[int, typer.Option(help="GPUs per replica, tensor parallel.")] = 1,
    util: Annotated[float, typer.Option(help="Share of GPU memory the engine may use.")] = 0.9,
    avg_context: Annotated[int | None, typer.Option(help="Average tokens per sequence.")] = None,
    weights: Annotated[str | None, typer.Option(help="Weight format, as inhouse plan.")] = None,
    kv_dtype: Annotated[str, typer.Option(help="KV cache dtype, as inhouse plan.")] = "auto",
    max_model_len: Annotated[int | None, typer.Option(help="Cap on one request.")] = None,
    max_num_seqs: Annotated[int | None, typer.Option(help="Sequences at once per replica.")] = None,
    routing: Annotated[
        str, typer.Option(help="prefix (a prompt's prefix back to its replica) or least-loaded.")
    ] = "prefix",
    manifest: Annotated[
        Path | None,
        typer.Option(help="Model manifest: verified before any replica starts; names the model."),
    ] = None,
    canary: Annotated[
        Path | None,
        typer.Option(help="Manifest of a candidate: one replica of it, a canary release."),
    ] = None,
    percent: Annotated[float, typer.Option(help="Share of keys the --canary answers.")] = 5.0,
    shadow: Annotated[float, typer.Option(help="Share mirrored to the --canary.")] = 0.0,
    cost: Annotated[
        Path | None,
        typer.Option(help="TOML file whose \\[cost] section prices team budgets (inhouse cost)."),
    ] = None,
    scale_up_after: Annotated[str, typer.Option(help="MIN:MAX: load high this long.")] = "30s",
    scale_down_after: Annotated[str, typer.Option(help="MIN:MAX: load low this long.")] = "5m",
    scale_cooldown: Annotated[str, typer.Option(help="MIN:MAX: quiet after an event.")] = "60s",
    scale_up_above: Annotated[float, typer.Option(help="Demand per seat that is high.")] = 1.0,
    scale_down_below: Annotated[
        float, typer.Option(help="Demand per seat of one replica fewer that is low.")
    ] = 0.5,
    slo: Annotated[
        str | None, typer.Option(help="ttft=2s: MIN:MAX also scales up on p99 TTFT above it.")
    ] = None,
    warm_replicas: Annotated[
        int | None,
        typer.Option(
            help="MIN:MAX: replicas kept loaded, unrouted, for a scale-up to route at once "
            "(default: MAX - MIN on a CPU host, 0 with GPUs)."
        ),
    ] = None,
    lora_modules: Annotated[
        list[str] | None,
        typer.Option(help="A LoRA adapter every replica serves, name=path (repeatable)."),
    ] = None,
    max_loras: Annotated[
        int | None, typer.Option(help="LoRA slots per replica (default max(adapters, 4)).")
    ] = None,
    max_lora_rank: Annotated[
        int | None, typer.Option(help="Largest LoRA rank a slot holds (default 16).")
    ] = None,
) -> None:
    """Start engine replicas and the gateway in front of them on http://127.0.0.1:8000."""
    from inhouse.gateway.config import ROUTINGS, default_database_url
    from inhouse.gateway.run import gateway_server, run_gateway
    from inhouse.launch.cpu_host import share_cores
    from inhouse.launch.replicas import stop_replicas
    from inhouse.up.autoscale import (
        Autoscaler,
        default_warm_replicas,
        parse_replicas,
        scale_settings,
    )
    from inhouse.up.canary import CanaryWatch, start_candidate
    from inhouse.up.gateway_config import up_config
    from inhouse.up.releases import ensure_stable_releases

    cost_table = _cost_table(cost)  # checked before any replica starts
    try:
        span = parse_replicas(replicas)
        scaling = scale_settings(scale_up_after, scale_down_after, scale_cooldown,
                                 scale_up_above, scale_down_below, slo)  # fmt: skip
    except ValueError as error:
        _fail(str(error))
    if warm_replicas is not None and warm_replicas < 0:
        _fail(f"--warm-replicas takes 0 or more, not {warm_replicas}")
    chosen = ENGINES.get(engine)
    if chosen is None:
        _fail(f"--engine takes one of {', '.join(ENGINES)}, not {engine!r}")
    assert chosen is not None
    try:
        chosen.executable()
    except EngineMissing as missing:
        _fail(str(missing))
    if routing not in ROUTINGS:
        _fail(f"--routing takes one of {', '.join(ROUTINGS)}, not {routing!r}")
    if tp > 1 and gpu is None and vram is None:
        _fail("--tp needs --gpu or --vram: tensor parallelism is planned per GPU")
    chat_name = served_name(model)
    pinned = None
    if manifest is not None:
        if model is not None:
            _fail("give MODEL or --manifest, not both (the manifest names it)")
        pinned = checked_manifest(manifest)
        model, chat_name = str(pinned.source_path()), pinned.name
    try:
        adapters = AdapterOptions.parse(lora_modules or [], max_loras, max_lora_rank)
        inputs = plan_inputs(gpu, vram, tp, util, avg_context, weights, kv_dtype, max_model_len,
                             adapters)  # fmt: skip
        settings = adapters.apply(launch_settings(model, inputs, max_model_len, max_num_seqs))
    except PlanError as error:
        _fail(str(error))
    if manifest is not None:
        settings = dataclasses.replace(settings, manifest=str(manifest.resolve()))
    if chosen.gguf_only and not settings.gguf:
        _fail(f"{chosen.name} loads GGUF files only; give it a .gguf file")
    if chosen.safetensors_only and settings.gguf:
        settings = safetensors_settings(chosen, settings)
    with_embeddings = embeddings and chosen.name == "inhouse"
    if embeddings and not with_embeddings:
        typer.echo(f"{chosen.name} replicas serve the chat model only (no embedding model)")
    promised = {port}  # the gateway binds its port after the replicas start
    start = replica_starter(chosen, settings, chat_name, with_embeddings, promised, span.high)
    started = [start(index) for index in range(1, span.low + 1)]
    warm = default_warm_replicas(span, settings.gpu) if warm_replicas is None else warm_replicas
    share = chosen.follows_cores and not settings.gpu  # the serving replicas split the cores
    if share:
        share_cores([replica.popen.pid for replica in started])
    scaler = (
        Autoscaler(chat_name, span, scaling, start, started, warm, share) if span.scales else None
    )
    candidate = None
    if canary is not None:

        def candidate_settings(source: str) -> LaunchSettings:
            return adapters.apply(launch_settings(source, inputs, max_model_len, max_num_seqs))

        candidate = start_candidate(chosen, canary, candidate_settings, span.high + 1, promised)
    stop_watch = threading.Event()
    try:
        config = up_config(
            chat_name,
            chosen,
            started,
            host,
            port,
            database or default_database_url(),
            with_embeddings,
            cost_table,
            settings.max_num_seqs,
            routing,
            adapters.names,
            settings.images_per_prompt,
        )
        secret = ensure_admin_key(config)
        if secret is not None:
            typer.echo(f"Created the '{ADMIN_KEY}' key; its secret is shown only now:\n{secret}")
        slots = tuple(f"{chosen.name}:{i}" for i in range(1, span.high + 1))
        stable = ensure_stable_releases(config, chat_name, None if pinned is None
                                        else (manifest, pinned), slots)  # fmt: skip
        typer.echo(f"Stable release {stable[chat_name]} of {chat_name!r} is these replicas"
                   " (`inhouse release status`)")  # fmt: skip
        typer.echo(
            f"Gateway on http://{host}:{port}/v1 in front of model {chat_name!r}"
            f" ({span.low} × {chosen.name}, loading; /health shows progress)"
        )
        server = gateway_server(config, [] if scaler is None else [scaler.run])
        outcome = StartWatch(list(started), server)
        outcome.start()
        if candidate is not None:
            CanaryWatch(candidate, config, chat_name, percent, shadow, stop_watch).start()
        run_gateway(config, server)
    finally:
        stop_watch.set()
        running = started if scaler is None else scaler.running
        stop_replicas(running + ([] if candidate is None else [candidate.replica]))
    if outcome.all_failed:
        raise typer.Exit(EXIT_NO_REPLICA)


def _fail(message: str) -> None:
    typer.echo(f"inhouse up: {message}", err=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def replica_starter(
    engine: Engine,
    settings: LaunchSettings,
    name: str,
    embeddings: bool,
    promised: set[int],
    slots: int,
) -> Callable[[int], Replica]:
    """What starts replica `index` (1 to `slots`) on a free loopback port outside `promised`
    (each port taken is added to it), with its own random key; on a CPU host at a lower CPU
    priority than the gateway (`replicas.CPU_HOST_NICE`), and given its slot's share of the
    cores (`LaunchSettings.cpu_cores`, which vLLM binds its threads to)."""
    from inhouse.launch.cpu_host import split_cores, usable_cores
    from inhouse.launch.replicas import start_replica

    cores = [()] * slots if settings.gpu else split_cores(usable_cores(), slots)

    def start(index: int) -> Replica:
        endpoint = Endpoint(
            "127.0.0.1", free_port(promised), name, replica_key(), embeddings=embeddings
        )
        promised.add(endpoint.port)
        command = engine.command(
            dataclasses.replace(settings, cpu_cores=cores[index - 1]), endpoint
        )
        if index == 1:
            for note in command.notes:
                typer.echo(f"note: {note}")
        replica = start_replica(engine, command, endpoint, index, sys.stdout, not settings.gpu)
        typer.echo(f"replica {replica.label}: pid {replica.popen.pid} on {replica.url}")
        return replica

    return start


def replica_key() -> str:
    """`$INHOUSE_UP_REPLICA_KEY` when set, else a fresh random key."""
    return os.environ.get(REPLICA_KEY_ENV) or secrets.token_urlsafe(32)


class StartWatch(threading.Thread):
    """Reports each replica's start, stops the gateway if none of them started, then
    reports a replica that exits while the gateway runs (the router goes around it)."""

    def __init__(self, replicas: list[Replica], server: uvicorn.Server) -> None:
        super().__init__(name="replica-start-watch", daemon=True)
        self.replicas = replicas
        self.server = server
        self.all_failed = False

    def run(self) -> None:
        from inhouse.launch.replicas import wait_started

        states = wait_started(self.replicas)
        for replica in self.replicas:
            if states[replica.label] is Health.READY:
                typer.echo(f"replica {replica.label} is ready on {replica.url}")
            else:
                typer.echo(f"inhouse up: {replica.failure()}", err=True)
        if all(state is not Health.READY for state in states.values()):
            typer.echo("inhouse up: no replica started; stopping", err=True)
            self.all_failed = True
            self.server.should_exit = True
            return
        running = [r for r in self.replicas if states[r.label] is Health.READY]
        while running and not self.server.should_exit:
            for replica in [r for r in running if r.popen.poll() is not None]:
                running.remove(replica)
                typer.echo(
                    f"inhouse up: replica {replica.label} exited with status "
                    f"{replica.popen.returncode}; the gateway routes around it",
                    err=True,
                )
            time.sleep(WATCH_INTERVAL_S)


def served_name(model: str | None) -> str:
    from inhouse.manifests.bundled import DEFAULT_CHAT_MODEL_NAME

    if model is None:
        return DEFAULT_CHAT_MODEL_NAME
    path = Path(model)
    return path.stem if path.suffix == ".gguf" else path.name


def _cost_table(path: Path | None) -> dict[str, Any]:
    """The raw `[cost]` table of `--cost` (checked when the config is parsed)."""
    if path is None:
        return {}
    from inhouse.cost.settings import CostConfigError, parse_cost

    try:
        with open(path, "rb") as f:
            table = tomllib.load(f).get("cost", {})
        parse_cost(table)
    except (OSError, tomllib.TOMLDecodeError, CostConfigError, AttributeError) as err:
        _fail(f"--cost {path}: {err}")
    return table


def ensure_admin_key(config: GatewayConfig) -> str | None:
    """Create the admin key on first start; returns its secret then, else None."""
    from inhouse.gateway.db_open import open_database
    from inhouse.gateway.keys import KeyStore, load_pepper

    db = open_database(config.database)
    try:
        store = KeyStore(db, load_pepper(config))
        found = next((k for k in store.list() if k.name == ADMIN_KEY), None)
        if found is not None:
            if not found.admin:  # made before keys had the flag: it opens the console too
                store.update(ADMIN_KEY, admin=True)
            return None
        _, secret = store.create(ADMIN_KEY, admin=True)
        return secret
    finally:
        db.dispose()
