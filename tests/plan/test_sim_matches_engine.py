"""The simulation's steps against the engine's: the same arrivals, step by step, through the
real ``Scheduler`` (the model out of the loop: every caught-up sequence samples a token
that is not EOS) and through ``SimEngine``, with each one's defaults for the prefill cap and
the background rows. Every step must schedule the same tokens for the same requests."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from inhouse.engine.config import EngineConfig, background_decode_rows, prefill_cap
from inhouse.engine.kv_cache import KVCacheManager
from inhouse.engine.sampler import SampledToken
from inhouse.engine.sampling_params import SamplingParams
from inhouse.engine.scheduler import Scheduler
from inhouse.engine.sequence import Sequence
from inhouse.plan.perf_model import StepCost
from inhouse.plan.sim_engine import SchedulerLimits, SimEngine
from inhouse.plan.sim_request import SimRequest

BS = 16
SEATS = 8
BUDGET = 2048
EOS = 2
FLAT = StepCost(base_s=0.01, weights_s=0.0, token_s=0.0, seq_s=0.0, context_s=0.0, pair_s=0.0)


@dataclass(frozen=True, slots=True)
class Arrival:
    step: int  # the request reaches the scheduler before this step (0: the first)
    name: str
    prompt: int
    output: int
    priority: int
    tenant: str


def arrivals() -> list[Arrival]:
    """A batch job of two tenants (more requests than seats), interactive chats coming
    while it decodes, one after another and two at once, and a default-priority prompt."""
    batch = [Arrival(0, f"etl{i}", 300 + 7 * i, 40 + i, 1, "etl") for i in range(7)]
    batch += [Arrival(0, f"ops{i}", 250 + 5 * i, 30 + 2 * i, 1, "ops") for i in range(3)]
    chats = [Arrival(at, f"chat{at}", 20 + at % 7, 6, -1, "alice") for at in (12, 19, 40)]
    chats += [Arrival(41, "chat41b", 33, 4, -1, "bob"), Arrival(90, "chat90", 18, 5, -1, "alice")]
    return [*batch, *chats, Arrival(25, "report", 600, 12, 0, "ops")]


def engine_steps(policy: str, pattern: list[Arrival]) -> tuple[list[dict[str, int]], int, int]:
    """Each step's tokens by request through the engine's scheduler, its preemptions, and
    the steps it scheduled nothing in while requests were unfinished."""
    config = EngineConfig(scheduling_policy=policy, max_num_seqs=SEATS)
    sched = Scheduler(
        KVCacheManager(4096, BS), SEATS, BUDGET, 4096, {EOS}, 1.0, policy,
        prefill_cap(config), background_decode_rows(config),
    )  # fmt: skip
    steps: list[dict[str, int]] = []
    added = empty = 0
    for now in range(10_000):
        for a in (a for a in pattern if a.step == now):
            tokens = [3 + (sum(map(ord, a.name)) * 31 + 7 * i) % 900 for i in range(a.prompt)]
            params = SamplingParams(max_tokens=a.output)
            seq = Sequence(
                a.name, tokens, params, cache_salt=a.tenant, priority=a.priority,
                arrival_time=float(added),
            )  # fmt: skip
            sched.add([seq])
            added += 1
        if not sched.has_unfinished():
            if now > max(a.step for a in pattern):
                break
            steps.append({})  # the engine waits for a request; no step runs
            continue
        out = sched.schedule()
        sched.update(out, lambda rows, _seqs: [SampledToken(1) for _ in rows])
        steps.append({seq.request_id: n for seq, n in out.scheduled})
        empty += not out.scheduled
    return steps, sched.num_preemptions, empty


def sim_steps(policy: str, pattern: list[Arrival]) -> tuple[list[dict[str, int]], int]:
    """The same through the simulated engine: a request's tokens are its computed delta."""
    sim = SimEngine(FLAT, SchedulerLimits(SEATS, BUDGET, block_size=BS, policy=policy))
    names: dict[int, str] = {}
    requests: list[SimRequest] = []
    steps: list[dict[str, int]] = []
    clock = 0.0
    for now in range(10_000):
        for a in (a for a in pattern if a.step == now):
            request = SimRequest(a.prompt, a.output, clock, priority=a.priority, tenant=a.tenant)
            names[id(request)] = a.name
            requests.append(request)
            sim.add(request)
        if sim.idle and now > max(a.step for a in pattern):
            break
        before = {id(r): r.computed for r in requests}
        clock = sim.step(clock)[0] if not sim.idle else clock
        took = {names[id(r)]: r.computed - before[id(r)] for r in requests}
        steps.append({name: n for name, n in took.items() if n > 0})
    return steps, sim.preemptions


@pytest.mark.parametrize("policy", ["fcfs", "priority", "fair"])
def test_the_simulated_steps_are_the_engines(policy: str) -> None:
    pattern = arrivals()
    engine, engine_preemptions, empty = engine_steps(policy, pattern)
    sim, sim_preemptions = sim_steps(policy, pattern)
    for number, (got, expected) in enumerate(zip(sim, engine, strict=True)):
        assert got == expected, f"step {number + 1}"
    assert sim_preemptions == engine_preemptions
    assert empty == 0  # under fair, background rows never fall on a tenant that yields
    if policy != "fcfs":  # the background rows held the batch back while chats were on
        assert any(len(s) == 1 + 4 and any(n.startswith("chat") for n in s) for s in engine)
        assert engine_preemptions > 0  # a chat took a seat from the batch
        gaps = [s for s in engine if len(s) == 1 and not any(n.startswith("chat") for n in s)]
        assert len(gaps) >= 5  # steps between chats: one batch decode
