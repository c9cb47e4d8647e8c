"""Prefix affinity (`gateway.affinity`): the prompt's chained block hashes, each replica's
memory of them, and the router's pick between a prefix's holder and the least-loaded
replica, on real Router/Backend objects."""

from __future__ import annotations

import asyncio

import pytest

from inhouse.gateway.affinity import (
    BLOCK_CHARS,
    HASHED_CHARS,
    PrefixMemory,
    prefix_chain,
    prompt_text,
)
from inhouse.gateway.backends import BackendState
from inhouse.gateway.config import HealthSettings, ModelRoute, Upstream
from inhouse.gateway.config_file import load_config
from inhouse.gateway.config_values import ConfigError
from inhouse.gateway.parsing import read_needs
from inhouse.gateway.routing import Router

DOCUMENT = "".join(f"Clause {i}: the tenant keeps the premises in good repair. " for i in range(60))
NEEDS = read_needs("chat/completions", {"messages": [{"content": "hi"}], "max_tokens": 1})


def chat(*contents: str, tools: list | None = None) -> dict:
    body: dict = {"messages": [{"role": "user", "content": c} for c in contents]}
    if tools:
        body["tools"] = tools
    return body


def chain(salt: str, *contents: str) -> tuple[bytes, ...]:
    return prefix_chain(salt, prompt_text("chat/completions", chat(*contents)))


def common(a: tuple[bytes, ...], b: tuple[bytes, ...]) -> int:
    """How many leading blocks two chains share."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def test_a_block_hash_names_the_whole_prefix_up_to_it() -> None:
    text = prompt_text("chat/completions", chat(DOCUMENT))
    whole = chain("a", DOCUMENT)
    assert len(whole) == len(text) // BLOCK_CHARS > 10  # a partial last block is not cached
    longer = chain("a", DOCUMENT, "What must the tenant repair?")
    assert longer[: len(whole) - 1] == whole[:-1]  # the question changes only the last blocks
    edited = chain("a", "X" + DOCUMENT[1:])
    assert not set(edited) & set(whole)  # one changed character: no later block matches
    assert not set(chain("b", DOCUMENT)) & set(whole)  # another tenant's salt: none at all
    assert chain("a", DOCUMENT) == whole


def test_the_prompt_is_read_in_the_order_an_engine_renders_it() -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    with_tools = prompt_text("chat/completions", chat("hi", tools=tools))
    assert with_tools.index("lookup") < with_tools.index("hi")
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    assert "hi" in prompt_text("chat/completions", parts)
    assert prompt_text("completions", {"prompt": "abc"}) == "abc"
    assert prompt_text("completions", {"prompt": [1, 2, 3]}) == ""  # token ids: no text
    assert prompt_text("embeddings", {"input": DOCUMENT}) == ""
    assert prompt_text("chat/completions", {"messages": "not a list"}) == ""
    long = chat(*(DOCUMENT for _ in range(60)))  # ~200k characters, more than is hashed
    text = prompt_text("chat/completions", long)
    assert HASHED_CHARS <= len(text) < HASHED_CHARS + 2 * len(DOCUMENT)  # not built further
    assert prefix_chain("a", text) == chain("a", *(DOCUMENT for _ in range(60)))
    assert len(prefix_chain("a", text)) == HASHED_CHARS // BLOCK_CHARS


def test_a_replica_remembers_the_most_recent_blocks_it_was_sent() -> None:
    memory = PrefixMemory(capacity=30)
    first = chain("a", DOCUMENT)
    memory.remember(first)
    assert memory.shared(first) == len(first)
    question = chain("a", DOCUMENT, "a question")
    assert memory.shared(question) == common(first, question) >= len(first) - 1
    assert memory.shared(chain("b", DOCUMENT)) == 0
    memory.remember(chain("a", "Another document entirely. " * 300))
    assert len(memory) == 30 and memory.shared(first) == 0  # its oldest blocks went first
    memory.forget()
    assert len(memory) == 0


def two_replicas(routing: str = "prefix", slack: int = 2) -> Router:
    backends = tuple(
        Upstream(f"b{i}", f"http://127.0.0.1:{9000 + i}", None, "m", max_in_flight=16)
        for i in range(2)
    )
    route = ModelRoute("m", backends, routing=routing, prefix_slack=slack)  # type: ignore[arg-type]
    router = Router([route], health_interval_s=7.0)
    for backend in router.backends["m"]:
        backend.state = BackendState.UP
    return router


async def route_of(router: Router, prefix: tuple[bytes, ...]) -> tuple[str, int]:
    lease = await router.acquire(router.routes["m"], NEEDS, False, prefix=prefix)
    router.release(lease)
    return lease.upstream.name, lease.prefix_blocks


def test_a_prefix_goes_back_to_the_replica_it_was_sent_to_within_the_slack() -> None:
    async def scenario() -> None:
        router = two_replicas(slack=2)
        b0, b1 = router.backends["m"]
        document = chain("a", DOCUMENT, "first question")
        assert await route_of(router, document) == ("b0", 0)  # nobody holds it: least-loaded
        again = chain("a", DOCUMENT, "second question")
        assert await route_of(router, again) == ("b0", common(document, again))
        for _ in range(2):  # equal loads would take turns; the prefix keeps it on b0
            assert await route_of(router, again) == ("b0", len(again))
        b0.waiting = 2  # two more than b1: still within the slack
        assert (await route_of(router, again))[0] == "b0"
        b0.waiting = 3  # beyond it: the least-loaded takes it, and now holds it too
        assert await route_of(router, again) == ("b1", 0)
        b0.waiting = 0
        assert (await route_of(router, again))[0] in ("b0", "b1")
        other = chain("b", DOCUMENT, "first question")  # the same text from another tenant
        b1.waiting = 1
        assert await route_of(router, other) == ("b0", 0)  # least-loaded, not by prefix

    asyncio.run(scenario())


def test_least_loaded_routing_and_short_prompts_ignore_prefixes() -> None:
    async def scenario() -> None:
        router = two_replicas(routing="least-loaded")
        document = chain("a", DOCUMENT)
        names = [(await route_of(router, ()))[0] for _ in range(4)]
        assert names == ["b0", "b1", "b0", "b1"]
        prefixed = two_replicas()
        assert chain("a", "Say hi.") == ()  # shorter than a block: nothing to route by
        names = [(await route_of(prefixed, chain("a", "Say hi.")))[0] for _ in range(4)]
        assert names == ["b0", "b1", "b0", "b1"]
        assert (await route_of(prefixed, document))[0] == "b0"
        assert await route_of(prefixed, document) == ("b0", len(document))

    asyncio.run(scenario())


def test_a_replica_that_goes_down_or_loads_again_is_forgotten() -> None:
    router = two_replicas()
    b0, _ = router.backends["m"]
    document = chain("a", DOCUMENT)
    b0.prefixes.remember(document)
    settings = HealthSettings(failures_to_down=1)
    assert b0.record_failure(settings, "refused") and b0.prefixes.shared(document) == 0
    b0.prefixes.remember(document)
    b0.state = BackendState.UP
    assert b0.record_starting() and b0.prefixes.shared(document) == 0


def test_routing_keys_are_checked(tmp_path) -> None:
    base = '[[models]]\nname = "m"\n{extra}\n[[models.backends]]\nurl = "http://127.0.0.1:1"\n'
    path = tmp_path / "gateway.toml"
    path.write_text(base.format(extra=""))
    route = load_config(path).models[0]
    assert (route.routing, route.prefix_slack) == ("prefix", 4)
    path.write_text(base.format(extra='routing = "least-loaded"\nprefix_slack = 0'))
    route = load_config(path).models[0]
    assert (route.routing, route.prefix_slack) == ("least-loaded", 0)
    for bad in ('routing = "random"', "prefix_slack = -1"):
        path.write_text(base.format(extra=bad))
        with pytest.raises(ConfigError, match=r"routing|prefix_slack"):
            load_config(path)
