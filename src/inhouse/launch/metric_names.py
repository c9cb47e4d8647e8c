"""The Prometheus names an engine exposes on `/metrics`, by what they mean to a reader.

The gateway's router reads load (waiting, KV usage), bench reads a run's gauges and
counters, observe's rules and dashboard select the vLLM-named series. Ours are vLLM's
names under `inhouse:` (`server/metrics.py` registers them from the constants here);
SGLang's and llama.cpp's are their own, and only those something reads are named.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

# vLLM's names without their prefix (`vllm:`; ours `inhouse:`), by kind.
# Gauges.
RUNNING = "num_requests_running"
WAITING = "num_requests_waiting"
KV_USAGE = "kv_cache_usage_perc"
# vLLM's deprecated name for the same gauge.
KV_USAGE_OLD = "gpu_cache_usage_perc"

# Counters, named as families: their samples end in `_total`.
PREFIX_QUERIES = "prefix_cache_queries"
PREFIX_HITS = "prefix_cache_hits"
PREEMPTIONS = "num_preemptions"
PROMPT_TOKENS = "prompt_tokens"
GENERATION_TOKENS = "generation_tokens"

# Histograms.
TTFT = "time_to_first_token_seconds"
ITL = "inter_token_latency_seconds"
# vLLM's older name for the same histogram.
ITL_OLD = "time_per_output_token_seconds"
E2E = "e2e_request_latency_seconds"

# Speculative decoding's counters.
SPEC_DRAFTS = "spec_decode_num_drafts"
SPEC_DRAFT_TOKENS = "spec_decode_num_draft_tokens"
SPEC_ACCEPTED = "spec_decode_num_accepted_tokens"

# The image encoder's counters: ours, vLLM has no such names.
IMAGES_ENCODED = "images_encoded"
IMAGE_ENCODE_SECONDS = "image_encode_seconds"
OURS_ALONE = (IMAGES_ENCODED, IMAGE_ENCODE_SECONDS)


@dataclass(frozen=True, slots=True)
class MetricNames:
    """One engine's metric names by meaning, each the full names to try in order (its
    current spelling before an older one); empty where the engine exposes none."""

    prefix: str
    vllm_named: bool = False  # vLLM's names under `prefix`: observe's selectors match it
    running: tuple[str, ...] = ()  # requests in the running batch (gauge)
    waiting: tuple[str, ...] = ()  # requests not yet scheduled (gauge): load
    kv_usage: tuple[str, ...] = ()  # KV-cache usage, 0 to 1 (gauge): load
    prefix_queries: tuple[str, ...] = ()  # prompt tokens looked up in the prefix cache
    prefix_hits: tuple[str, ...] = ()  # prompt tokens found there
    preemptions: tuple[str, ...] = ()  # sequences preempted for KV
    spec_drafts: tuple[str, ...] = ()  # speculative drafts verified
    spec_draft_tokens: tuple[str, ...] = ()  # draft tokens verified
    spec_accepted_tokens: tuple[str, ...] = ()  # draft tokens accepted
    ttft: tuple[str, ...] = ()  # time to first token (histogram)
    itl: tuple[str, ...] = ()  # time between tokens (histogram)
    e2e: tuple[str, ...] = ()  # arrival to finish (histogram)
    images_encoded: tuple[str, ...] = ()  # images a vision encoder ran over
    image_encode_seconds: tuple[str, ...] = ()  # the time it took

    def all_names(self) -> frozenset[str]:
        """Every name declared, whatever its meaning."""
        values = (getattr(self, f.name) for f in fields(self))
        return frozenset(name for value in values if isinstance(value, tuple) for name in value)


def vllm_names(prefix: str, *, older: bool = False) -> MetricNames:
    """vLLM's names under `prefix`; `older` also tries vLLM's deprecated spellings."""

    def named(*suffixes: str) -> tuple[str, ...]:
        return tuple(prefix + s for s in suffixes)

    return MetricNames(
        prefix=prefix,
        vllm_named=True,
        running=named(RUNNING),
        waiting=named(WAITING),
        kv_usage=named(KV_USAGE, KV_USAGE_OLD) if older else named(KV_USAGE),
        prefix_queries=named(PREFIX_QUERIES),
        prefix_hits=named(PREFIX_HITS),
        preemptions=named(PREEMPTIONS),
        spec_drafts=named(SPEC_DRAFTS),
        spec_draft_tokens=named(SPEC_DRAFT_TOKENS),
        spec_accepted_tokens=named(SPEC_ACCEPTED),
        ttft=named(TTFT),
        itl=named(ITL, ITL_OLD) if older else named(ITL),
        e2e=named(E2E),
    )


def inhouse_names() -> MetricNames:
    """Ours: vLLM's names under `inhouse:`, and the image encoder's counters vLLM lacks."""
    return replace(
        vllm_names("inhouse:"),
        images_encoded=("inhouse:" + IMAGES_ENCODED,),
        image_encode_seconds=("inhouse:" + IMAGE_ENCODE_SECONDS,),
    )
