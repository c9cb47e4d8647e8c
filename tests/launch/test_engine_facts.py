"""Each engine's facts, held on its `Engine` class, agree with themselves, with what our
server exposes, and with what the gateway, bench and observe read from them."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inhouse.bench.scrape import read_gauges
from inhouse.engine.speculative.drafter import SpecDecodeCounters
from inhouse.engine.stats import EngineStats, RequestTiming
from inhouse.gateway.backends import read_load
from inhouse.gateway.config import Upstream
from inhouse.launch import BACKENDS, ENGINES
from inhouse.launch.inhouse import InhouseEngine
from inhouse.launch.metric_names import OURS_ALONE, vllm_names
from inhouse.observe.rules import ENGINE_PREFIX
from inhouse.server.metrics import ServerMetrics

SCRAPED = [kind for kind, backend in BACKENDS.items() if backend.metrics is not None]


def our_exposition() -> str:
    """Our server's `/metrics` page, every engine series non-zero."""
    stats = EngineStats(
        num_running=3, num_waiting=2, kv_cache_usage=0.5, num_blocks=64, block_size=16,
        prefix_cache_queries=100, prefix_cache_hits=40, num_preemptions=1, prompt_tokens=100,
        generation_tokens=20, num_steps=30,
        spec_decode=SpecDecodeCounters(4, 12, 7, [3, 2, 2]),
        images_encoded=6, image_encode_seconds=0.25,
    )  # fmt: skip
    metrics = ServerMetrics("m", lambda: stats)
    metrics.observe_finished(RequestTiming("r", 0.0, 0.1, 0.3, 1.0, 10, 5, "stop"))
    return metrics.exposition().decode()


def test_every_engine_is_a_backend_under_its_kind() -> None:
    assert all(BACKENDS[engine.kind] is engine for engine in ENGINES.values())
    assert all(kind == backend.kind for kind, backend in BACKENDS.items())


@pytest.mark.parametrize("kind", SCRAPED)
def test_names_are_under_the_engines_prefix_and_give_load(kind: str) -> None:
    names = BACKENDS[kind].metrics
    assert names is not None and names.waiting, "the router reads waiting from every scrape"
    assert all(name.startswith(names.prefix) for name in names.all_names())
    if names.vllm_named:  # vLLM's names, at most vLLM's older spellings and ours alone besides
        assert vllm_names(names.prefix).all_names() <= names.all_names()
        ours = {names.prefix + name for name in OURS_ALONE}
        assert names.all_names() - ours <= vllm_names(names.prefix, older=True).all_names()


def test_our_server_exposes_every_name_our_engine_declares() -> None:
    families = {f.name for f in text_string_to_metric_families(our_exposition())}
    declared = InhouseEngine.metrics.all_names()
    assert declared and declared <= families, sorted(declared - families)


def test_bench_and_the_router_read_our_server_in_its_declared_names() -> None:
    page = our_exposition()
    reading = read_gauges(page)
    assert (reading.running, reading.waiting, reading.kv_cache_usage) == (3, 2, 0.5)
    assert (reading.prefix_queries, reading.prefix_hits, reading.preemptions) == (100, 40, 1)
    assert (reading.spec_drafts, reading.spec_draft_tokens, reading.spec_accepted_tokens) == (
        4, 12, 7,
    )  # fmt: skip
    assert (reading.images_encoded, reading.image_encode_seconds) == (6, 0.25)
    assert read_load(page, "inhouse") == (2, 0.5)


def test_observe_selects_the_engines_with_vllms_names() -> None:
    prefixes = {b.metrics.prefix for b in BACKENDS.values() if b.metrics and b.metrics.vllm_named}
    assert prefixes == {"inhouse:", "vllm:"}
    assert ENGINE_PREFIX == "(inhouse|vllm)"


def test_the_gateway_reads_each_kinds_request_fields_from_its_engine() -> None:
    """The sets the gateway kept before the facts moved to the engines, unchanged."""

    def kinds(has: str) -> set[str]:
        return {k for k in BACKENDS if getattr(Upstream("u", "http://h", None, "m", k), has)}

    assert set(BACKENDS) == {"inhouse", "vllm", "sglang", "llama.cpp", "openai"}
    assert kinds("saltable") == kinds("tokenizes") == {"inhouse", "vllm", "sglang"}
    assert kinds("scraped") == {"inhouse", "vllm", "sglang", "llama.cpp"}
    assert kinds("prioritized") == {"inhouse", "vllm"}
