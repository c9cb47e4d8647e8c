"""Prometheus metrics with vLLM's names under the ``inhouse:`` prefix, one registry per app.

The names others read (gateway load, bench, observe) are the ones our engine declares in
:mod:`inhouse.launch.metric_names`; the rest only this module names.

Gauges and counters the engine already keeps are read from ``EngineStats`` at scrape
time (a custom collector, so the numbers cannot drift); per-request histograms are
observed by the server as requests finish. Every series carries ``model_name``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from inhouse.engine.outputs import RequestOutput
from inhouse.engine.speculative.drafter import SpecDecodeCounters
from inhouse.engine.stats import EmbeddingStats, EngineStats, RequestTiming
from inhouse.launch import metric_names as names
from inhouse.launch.inhouse import InhouseEngine

PREFIX = InhouseEngine.metrics.prefix
FINISH_REASONS = ("stop", "length", "abort")
LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
)  # fmt: skip
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


def _model_counters(
    counters: dict[str, tuple[str, float]], model: str
) -> Iterator[CounterMetricFamily]:
    """One counter family per ``name: (doc, value)``, labelled with the model's name."""
    for name, (doc, value) in counters.items():
        family = CounterMetricFamily(PREFIX + name, doc, labels=["model_name"])
        family.add_metric([model], value)
        yield family


class EngineStatsCollector(Collector):
    """Engine gauges and counters, read fresh on every scrape."""

    def __init__(self, stats: Callable[[], EngineStats | None], model_name: str) -> None:
        self._stats = stats
        self._model = model_name

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self._stats()
        if stats is None:
            return
        gauges = {
            names.RUNNING: ("Requests in the running batch.", stats.num_running),
            names.WAITING: ("Requests waiting to be scheduled.", stats.num_waiting),
            names.KV_USAGE: ("KV-cache usage, 0 to 1.", stats.kv_cache_usage),
        }
        for name, (doc, value) in gauges.items():
            family = GaugeMetricFamily(PREFIX + name, doc, labels=["model_name"])
            family.add_metric([self._model], value)
            yield family
        counters = {
            names.PREFIX_QUERIES: ("Prompt tokens looked up.", stats.prefix_cache_queries),
            names.PREFIX_HITS: ("Prompt tokens found cached.", stats.prefix_cache_hits),
            names.PREEMPTIONS: ("Sequences preempted for KV.", stats.num_preemptions),
            names.PROMPT_TOKENS: ("Prompt tokens processed.", stats.prompt_tokens),
            names.GENERATION_TOKENS: ("Tokens generated.", stats.generation_tokens),
            "abandoned_steps": (
                "Steps stopped before a layer for a request of a better priority.",
                stats.abandoned_steps,
            ),
            "abandoned_tokens": (
                "Tokens those steps had scheduled (computed again later).",
                stats.abandoned_tokens,
            ),
            names.IMAGES_ENCODED: (
                "Images the vision encoder ran over (a prefix-cache hit skips it).",
                stats.images_encoded,
            ),
            names.IMAGE_ENCODE_SECONDS: (
                "Seconds the vision encoder took over them.",
                stats.image_encode_seconds,
            ),
        }
        yield from _model_counters(counters, self._model)
        preemptions = CounterMetricFamily(
            PREFIX + "num_preemptions_by_cause",
            "Sequences preempted, by cause: kv (the pool ran dry) or priority (yielded to a "
            "waiting request of a better priority).",
            labels=["model_name", "cause"],
        )
        for cause in sorted({"kv", "priority"} | set(stats.preemptions_by_cause)):
            preemptions.add_metric([self._model, cause], stats.preemptions_by_cause.get(cause, 0))
        yield preemptions
        success = CounterMetricFamily(
            PREFIX + "request_success",
            "Finished requests by finish reason.",
            labels=["model_name", "finished_reason"],
        )
        for reason in sorted(set(FINISH_REASONS) | set(stats.finished_requests)):
            success.add_metric([self._model, reason], stats.finished_requests.get(reason, 0))
        yield success
        if stats.spec_decode is not None:
            yield from self._spec_decode(stats.spec_decode)

    def _spec_decode(self, spec: SpecDecodeCounters) -> Iterator[CounterMetricFamily]:
        """vLLM's speculative-decoding counters (present only with speculation on)."""
        counters = {
            names.SPEC_DRAFTS: ("Drafts verified.", spec.num_drafts),
            names.SPEC_DRAFT_TOKENS: ("Draft tokens verified.", spec.num_draft_tokens),
            names.SPEC_ACCEPTED: ("Draft tokens accepted.", spec.num_accepted_tokens),
        }
        yield from _model_counters(counters, self._model)
        per_pos = CounterMetricFamily(
            PREFIX + "spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted, by position in the draft.",
            labels=["model_name", "position"],
        )
        for position, value in enumerate(spec.num_accepted_tokens_per_pos):
            per_pos.add_metric([self._model, str(position)], value)
        yield per_pos


class EmbeddingStatsCollector(Collector):
    """The embedding model's queue and work done, read fresh on every scrape."""

    def __init__(self, stats: Callable[[], EmbeddingStats | None], model_name: str) -> None:
        self._stats = stats
        self._model = model_name

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self._stats()
        if stats is None:
            return
        unfinished = GaugeMetricFamily(
            PREFIX + "embedding_requests_unfinished",
            "Embedding requests queued or running.",
            labels=["model_name"],
        )
        unfinished.add_metric([self._model], stats.unfinished)
        yield unfinished
        counters = {
            "embedding_inputs": ("Embedding inputs computed.", stats.inputs),
            "embedding_tokens": ("Tokens of the embedding inputs computed.", stats.tokens),
        }
        yield from _model_counters(counters, self._model)


class ServerMetrics:
    """The app's registry: engine and embedding collectors plus per-request latency
    histograms."""

    def __init__(
        self,
        model_name: str,
        stats: Callable[[], EngineStats | None],
        embedding_stats: Callable[[], EmbeddingStats | None] = lambda: None,
        embedding_name: str | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(EngineStatsCollector(stats, model_name))
        if embedding_name is not None:
            self.registry.register(EmbeddingStatsCollector(embedding_stats, embedding_name))
        self._model = model_name

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(
                PREFIX + name, doc, ["model_name"], registry=self.registry, buckets=buckets
            ).labels(model_name)

        self.ttft = histogram(names.TTFT, "Time to first token.", LATENCY_BUCKETS)
        self.itl = histogram(names.ITL, "Time between generated tokens.", LATENCY_BUCKETS)
        self.e2e = histogram(names.E2E, "Arrival to finish.", LATENCY_BUCKETS)
        self.queue = histogram(
            "request_queue_time_seconds", "Arrival to first scheduling.", LATENCY_BUCKETS
        )
        self.prefill = histogram(
            "request_prefill_time_seconds", "First scheduling to first token.", LATENCY_BUCKETS
        )
        self.decode = histogram(
            "request_decode_time_seconds", "First token to finish.", LATENCY_BUCKETS
        )
        self.prompt_len = histogram(
            "request_prompt_tokens", "Prompt tokens per request.", TOKEN_BUCKETS
        )
        self.generation_len = histogram(
            "request_generation_tokens", "Generated tokens per request.", TOKEN_BUCKETS
        )

    def observe_finished(self, timing: RequestTiming) -> None:
        """Record a finished request's latencies and lengths."""
        self.e2e.observe(timing.e2e_latency)
        self.prompt_len.observe(timing.num_prompt_tokens)
        self.generation_len.observe(timing.num_generation_tokens)
        if timing.queue_time is not None:
            self.queue.observe(timing.queue_time)
        if timing.time_to_first_token is not None:
            self.ttft.observe(timing.time_to_first_token)
            if timing.first_scheduled_time is not None:
                self.prefill.observe(timing.first_token_time - timing.first_scheduled_time)
            self.decode.observe(timing.finished_time - timing.first_token_time)

    def exposition(self) -> bytes:
        """The exposition text for ``GET /metrics``."""
        return generate_latest(self.registry)


class TokenClock:
    """Inter-token latency of one request: one observation per token after each choice's first."""

    def __init__(self, itl: Histogram, now: Callable[[], float]) -> None:
        self._itl = itl
        self._now = now
        self._last: dict[int, float] = {}

    def tick(self, output: RequestOutput) -> None:
        """Observe the gaps for the tokens this output adds."""
        now = self._now()
        for choice in output.outputs:
            count = len(choice.token_ids)
            if not count:
                continue
            last = self._last.get(choice.index)
            if last is not None:
                gap = (now - last) / count
                for _ in range(count):
                    self._itl.observe(gap)
            elif count > 1:
                for _ in range(count - 1):
                    self._itl.observe(0.0)
            self._last[choice.index] = now
