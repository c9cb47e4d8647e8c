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
"""

from __future__ import annotations

from inhouse.gateway.backends import Backend
from inhouse.gateway.config import Upstream

KEPT_FOR = "interactive"  # the class the kept seats are for


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
