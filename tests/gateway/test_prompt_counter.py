"""Which replica counts a prompt (`admission.count_prompt`), over two real canned upstreams:
the least loaded, and for a stream its client left, another than the one aborting it."""

from __future__ import annotations

import asyncio

from canned_upstream import canned_upstream

from inhouse.gateway.admission import count_prompt
from inhouse.gateway.backends import Backend, BackendState
from inhouse.gateway.config import ModelRoute, Upstream
from inhouse.gateway.exchange import UpstreamClients
from inhouse.gateway.parsing import read_needs
from inhouse.gateway.routing import Router

BODY = {"messages": [{"role": "user", "content": "one two three"}], "max_tokens": 1}
NEEDS = read_needs("chat/completions", BODY)


def test_the_least_loaded_replica_counts_and_never_the_busy_one_while_another_is_up() -> None:
    with canned_upstream() as first, canned_upstream() as second:
        upstreams = tuple(
            Upstream(f"b{i}", c.url, None, "m", kind="vllm") for i, c in enumerate((first, second))
        )
        router = Router([ModelRoute("m", upstreams)], health_interval_s=7.0)
        b0, b1 = router.backends["m"]
        b0.state = b1.state = BackendState.UP

        async def count(busy: Backend | None = None) -> None:
            clients = UpstreamClients()
            try:
                await count_prompt(clients, router, "m", "chat/completions", BODY, NEEDS, busy)
            finally:
                await clients.aclose()

        b1.in_flight = 1
        asyncio.run(count())  # b0 is the less loaded
        asyncio.run(count(busy=b0))  # b0 runs the stream: b1 counts, though busier
        b1.state = BackendState.DOWN
        asyncio.run(count(busy=b0))  # no other up: b0 after all
        assert (len(first.received), len(second.received)) == (2, 1)
