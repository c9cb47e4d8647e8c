"""Seats kept for interactive requests on each replica.

A replica runs at most `max_num_seqs` sequences at once, and an engine's scheduler may
never take a running sequence's seat for a waiting one of a sooner class (vLLM's v1
scheduler preempts only for KV blocks): once a flood of later classes fills every seat,
an interactive request waits for one of them to finish, however it is ordered. So the
gateway lets requests of the other classes hold at most `max_num_seqs −
interactive_seats` of a replica's slots; the rest of them wait in the gateway's queue (in
class order) and go as slots free, while an interactive request takes any slot up to
`max_in_flight` and starts at the engine's next step. A replica whose `max_num_seqs` the
gateway is not told (`inhouse up` tells it) keeps every slot open to every class. One seat
by default (`DEFAULT_INTERACTIVE_SEATS`): a chat client sends one request at a time.

A kept seat lets an interactive request in at the engine's next step, but that step is slow
when the replica runs a flood of batch sequences beside it (on vLLM's CPU backend a step
beside seven of them took twice an idle one's time). So while requests of the other classes
keep coming (one within `ONLINE_WINDOW_S`), batch requests also leave whole replicas free:
`batch_free_replicas` of a model's replicas that are up (the last in its configured order;
never all of them), where interactive and default requests find idle steps. With no such
request for the window, batch takes every replica again.
"""

from __future__ import annotations

from inhouse.gateway.backends import Backend, BackendState
from inhouse.gateway.config import Upstream

KEPT_FOR = "interactive"  # the class the kept seats are for
KEPT_FROM = "batch"  # the class the batch-free replicas are kept from
ONLINE_WINDOW_S = 300.0  # an online request this recent keeps the batch-free replicas free


def class_slots(upstream: Upstream, priority: str, interactive_seats: int) -> int:
    """How many of the replica's slots requests of class `priority` may hold at once
    (never fewer than one: a class is slowed, not shut out)."""
    seqs = upstream.max_num_seqs
    if priority == KEPT_FOR or seqs is None or interactive_seats <= 0:
        return upstream.max_in_flight
    return min(upstream.max_in_flight, max(1, seqs - interactive_seats))


def takes(backend: Backend, priority: str, interactive_seats: int) -> bool:
    """Whether the replica is routable and has a slot a request of `priority` may take."""
    slots = class_slots(backend.upstream, priority, interactive_seats)
    return backend.routable and backend.in_flight < slots


def batch_free(backends: list[Backend], replicas: int) -> frozenset[int]:
    """The replicas (by id) batch requests leave free: the last `replicas` of those up and
    not draining (however busy), always leaving batch at least one."""
    serving = [b for b in backends if b.state is BackendState.UP and not b.draining]
    kept = min(replicas, len(serving) - 1)
    return frozenset(id(b) for b in serving[len(serving) - kept :]) if kept > 0 else frozenset()
