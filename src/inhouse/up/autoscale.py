"""`inhouse up --replicas MIN:MAX`: replicas started and drained on the seeds' signals.

A loop on the gateway's event loop (`gateway.app.create_app`'s background) reads one
model's signals each tick and asks `scale_policy.Hysteresis` whether to act. Up: a replica
starts in the lowest free slot (its label `engine:slot`; for vLLM on a CPU host, its share
of the cores), and joins the router for every model it serves once its `/health` says
ready. Down: the newest replica is drained: the gateway sends it no new request, the ones
running finish (for at most the gateway's request timeout), then it leaves the router and
its process stops. One event at a time; each is printed with its reason and counted in
`inhouse:scale_events_total`. The stable release `inhouse up` makes names every slot
(`up.releases`), so a replica started later answers for it.

A warm pool (`--warm-replicas`) keeps replicas loaded but unrouted, so a scale-up routes one
at once instead of loading a model while the load is high. On a CPU host that matters twice:
a cold start also takes its seconds of CPU from the very cores the replicas serving the
load run on. The pool is filled one replica at a time while the load is low: once the
replicas `inhouse up` started are ready, and again after each drain (the drained replica
itself is stopped, as without a pool, and a fresh one loaded in its place).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import typer

from inhouse.bench.metrics import parse_slo
from inhouse.gateway.backends import Backend, BackendState
from inhouse.gateway.durations import parse_duration
from inhouse.gateway.handler import Gateway
from inhouse.launch.base import Health
from inhouse.launch.cpu_host import core_list, share_cores
from inhouse.launch.replicas import Replica, stop_replicas, wait_started
from inhouse.up.scale_policy import (
    Decision,
    Hysteresis,
    ScaleSettings,
    TtftWindow,
    read_signals,
)

DRAIN_POLL_S = 0.2  # also how often a scale-up looks for the warm replica being loaded


@dataclass(frozen=True, slots=True)
class ReplicaRange:
    """`--replicas N` (fixed) or `MIN:MAX` (autoscaled)."""

    low: int
    high: int

    @property
    def scales(self) -> bool:
        return self.high > self.low


def parse_replicas(text: str) -> ReplicaRange:
    """`3` or `1:3`; ValueError saying what is wrong otherwise."""
    parts = text.split(":")
    if len(parts) > 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"--replicas takes N or MIN:MAX (whole numbers), not {text!r}")
    low, high = int(parts[0]), int(parts[-1])
    if low < 1:
        raise ValueError(f"--replicas {text}: at least one replica must run (MIN >= 1)")
    if high < low:
        raise ValueError(f"--replicas {text}: MAX ({high}) is below MIN ({low})")
    return ReplicaRange(low, high)


def scale_settings(
    up_after: str, down_after: str, cooldown: str, up_above: float, down_below: float,
    slo: str | None,
) -> ScaleSettings:  # fmt: skip
    """The autoscaler's settings from `inhouse up`'s flags; ValueError on bad ones."""
    ttft = None if slo is None else parse_slo(slo).ttft
    settings = ScaleSettings(
        up_after_s=parse_duration(up_after),
        down_after_s=parse_duration(down_after),
        cooldown_s=parse_duration(cooldown),
        up_above=up_above,
        down_below=down_below,
        ttft_slo_s=ttft,
    )
    settings.check()
    return settings


def default_warm_replicas(span: ReplicaRange, gpu: bool) -> int:
    """A warm replica for every slot above MIN on a CPU host (where a cold start under load
    takes CPU from the replicas serving it); none on GPUs (a warm one holds its GPUs)."""
    return 0 if gpu else span.high - span.low


class Autoscaler:
    """Keeps between `span.low` and `span.high` replicas of `model` routed, and up to `warm`
    more loaded but unrouted (the module's warm pool); `running` is every replica it has not
    stopped (the initial ones first), for `inhouse up` to stop at exit. With `share` (an
    engine whose threads follow its cores, on a CPU host) the routed replicas split the
    cores between them after every event (`cpu_host.share_cores`): a replica added under
    load then takes its own cores instead of running its threads on the others'."""

    def __init__(
        self, model: str, span: ReplicaRange, settings: ScaleSettings,
        start: Callable[[int], Replica], running: list[Replica], warm: int = 0,
        share: bool = False,
    ) -> None:  # fmt: skip
        self.model, self.span, self.settings = model, span, settings
        self._start = start
        self.running = list(running)
        self._initial = list(running)
        self._serving = list(running)  # routed (or draining), oldest first
        self._warm: list[Replica] = []  # loaded, not routed
        self._warm_target = min(warm, span.high - span.low)
        self._share = share  # split a CPU host's cores between the routed replicas
        self._filling: asyncio.Task[None] | None = None
        self._policy = Hysteresis(settings, span.low, span.high)
        self._ttft = TtftWindow(max(settings.up_after_s, settings.tick_s))
        self._stop = threading.Event()  # set when the loop ends: a start being waited for

    async def run(self, gateway: Gateway) -> None:
        """Read the signals each tick and act on the policy's decisions, until cancelled."""
        metrics = gateway.metrics
        metrics.autoscaling(self.model, self.span.high)
        warm = f"; {self._warm_target} kept warm" if self._warm_target else ""
        typer.echo(f"autoscale: {self.model!r} between {self.span.low} and {self.span.high} "
                   f"replicas ({_describe(self.settings)}{warm})")  # fmt: skip
        self._fill_pool()
        try:
            await self._loop(gateway)
        finally:
            self._stop.set()
            if self._filling is not None:
                self._filling.cancel()

    async def _loop(self, gateway: Gateway) -> None:
        metrics, router = gateway.metrics, gateway.router
        while True:
            await asyncio.sleep(self.settings.tick_s)
            now = time.monotonic()
            p99 = self._ttft.add(now, metrics.ttft_buckets(self.model))
            signals = read_signals(router.backends[self.model], router.queue_depth(self.model), p99)
            decision = self._policy.step(now, signals)
            if decision is None:
                continue
            before = signals.replicas
            after = before + (1 if decision.direction == "up" else -1)
            typer.echo(f"autoscale: {self.model!r} {decision.direction} {before} → {after} "
                       f"({decision.detail})")  # fmt: skip
            metrics.scale_events.labels(self.model, decision.direction, decision.reason).inc()
            if decision.direction == "up":
                await self._add(gateway, decision)
            else:
                await self._drain(gateway)
            self._policy.settle(time.monotonic())

    def _fill_pool(self) -> None:
        """Load warm replicas in the background until the pool is full, one at a time."""
        if self._warm_target and (self._filling is None or self._filling.done()):
            self._filling = asyncio.create_task(self._fill())

    async def _fill(self) -> None:
        # First the replicas `inhouse up` started: loading beside them would slow them.
        await asyncio.to_thread(wait_started, self._initial, 0.5, self._stop)
        self._initial = []  # waited for once: a refill after a drain starts at once
        while len(self._warm) < self._warm_target and len(self.running) < self.span.high:
            replica = await self._launch()
            if replica is None:
                return  # logged; the next drain tries again
            self._warm.append(replica)
            typer.echo(f"replica {replica.label} is warm on {replica.url} "
                       "(loaded; routed at a scale-up)")  # fmt: skip

    async def _launch(self) -> Replica | None:
        """Start a replica in the lowest free slot and wait for it: None if it failed."""
        taken = {r.index for r in self.running}
        slot = min(set(range(1, self.span.high + 1)) - taken)
        # Started on the event loop's thread, which lives as long as `inhouse up`: the
        # kernel's parent-death signal (`launch.replicas`) follows the thread that forked.
        replica = self._start(slot)
        self.running.append(replica)
        states = await asyncio.to_thread(wait_started, [replica], 0.5, self._stop)
        if states[replica.label] is not Health.READY:
            typer.echo(f"autoscale: {replica.failure()}", err=True)
            await asyncio.to_thread(stop_replicas, [replica])
            self.running.remove(replica)
            return None
        return replica

    async def _add(self, gateway: Gateway, decision: Decision) -> None:
        """Route a warm replica (waiting for the one loading, if any), else start one in
        the lowest free slot and route to it once it is ready."""
        while not self._warm and self._filling is not None and not self._filling.done():
            await asyncio.sleep(DRAIN_POLL_S)  # one is loading: sooner than a start of our own
        while self._warm and self._warm[0].popen.poll() is not None:
            gone = self._warm.pop(0)  # exited while warm: its slot is free again
            self.running.remove(gone)
        source = "from the warm pool"
        if self._warm:
            replica: Replica | None = self._warm.pop(0)
        else:
            replica, source = await self._launch(), "cold"
        if replica is None:
            return
        self._serving.append(replica)
        for route in gateway.config.models:  # `inhouse up`'s: each served by every replica
            template = route.backends[0]
            upstream = dataclasses.replace(
                template, name=replica.label, url=replica.url, api_key=replica.endpoint.api_key
            )
            gateway.router.add(Backend(upstream, route.name, state=BackendState.UP))
        self._split_cores()
        typer.echo(f"replica {replica.label} is ready on {replica.url} "
                   f"(started for {decision.reason}, {source})")  # fmt: skip

    def _split_cores(self) -> None:
        if self._share:
            shares = share_cores([r.popen.pid for r in self._serving])
            pairs = zip(self._serving, shares, strict=True)
            shown = ", ".join(f"{replica.label} {core_list(cores)}" for replica, cores in pairs)
            typer.echo(f"autoscale: cores {shown}")

    async def _drain(self, gateway: Gateway) -> None:
        """Drain the newest routed replica: no new requests, the running ones finish, then
        stop; then refill the warm pool."""
        replica = self._serving[-1]
        router = gateway.router
        mine = [b for b in router.all_backends() if b.upstream.url == replica.url]
        for backend in mine:
            backend.draining = True
        running = sum(b.in_flight for b in mine)
        typer.echo(f"autoscale: draining {replica.label}: {running} request(s) running")
        deadline = time.monotonic() + gateway.config.request_timeout_s
        while any(b.in_flight for b in mine) and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        left = sum(b.in_flight for b in mine)
        for backend in mine:
            router.remove(backend)
        await asyncio.to_thread(stop_replicas, [replica])
        self.running.remove(replica)
        self._serving.remove(replica)
        self._split_cores()
        cut = f"; {left} cut off at the request timeout" if left else ""
        typer.echo(f"autoscale: drained {replica.label}: stopped after its {running} "
                   f"request(s) finished{cut}")  # fmt: skip
        self._fill_pool()


def _describe(t: ScaleSettings) -> str:
    slo = "" if t.ttft_slo_s is None else f", p99 TTFT > {t.ttft_slo_s:g} s"
    return (
        f"up when demand > {t.up_above:g} per seat{slo}, waiting or KV > {t.kv_above:g} for "
        f"{t.up_after_s:g} s; down when it would be ≤ {t.down_below:g} per seat of one fewer "
        f"for {t.down_after_s:g} s; {t.cooldown_s:g} s cooldown"
    )
