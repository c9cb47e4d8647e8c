import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from inhouse.bench.scrape import ServerReadings, read_gauges


def _exposition(prefix: str, kv_name: str, kv: float, waiting: float) -> str:
    registry = CollectorRegistry()
    usage = Gauge(f"{prefix}:{kv_name}", "KV usage", ["model_name"], registry=registry)
    queue = Gauge(f"{prefix}:num_requests_waiting", "waiting", ["model_name"], registry=registry)
    running = Gauge(f"{prefix}:num_requests_running", "running", ["model_name"], registry=registry)
    usage.labels("m").set(kv)
    queue.labels("m").set(waiting)
    running.labels("m").set(3)
    return generate_latest(registry).decode()


@pytest.mark.parametrize(
    ("prefix", "kv_name"),
    [
        ("vllm", "kv_cache_usage_perc"),
        ("vllm", "gpu_cache_usage_perc"),
        ("inhouse", "kv_cache_usage_perc"),
    ],
)
def test_reads_vllm_and_inhouse_names(prefix: str, kv_name: str) -> None:
    gauges = read_gauges(_exposition(prefix, kv_name, 0.42, 5))
    assert gauges.kv_cache_usage == pytest.approx(0.42)
    assert gauges.waiting == 5 and gauges.running == 3


def test_unknown_names_read_as_absent_and_peaks_keep_maxima() -> None:
    assert read_gauges("# HELP x y\nprocess_cpu_seconds_total 4.0\n").kv_cache_usage is None
    peaks = ServerReadings()
    for kv, waiting in ((0.2, 0), (0.9, 7), (0.5, 2)):
        peaks.add(read_gauges(_exposition("vllm", "kv_cache_usage_perc", kv, waiting)))
    assert (peaks.samples, peaks.kv_cache_usage_peak, peaks.waiting_peak) == (3, 0.9, 7)


def test_counters_give_hit_rate_and_preemptions_over_the_run() -> None:
    def exposition(queries: float, hits: float, preempted: float) -> str:
        registry = CollectorRegistry()
        for name, value in (
            ("prefix_cache_queries", queries),
            ("prefix_cache_hits", hits),
            ("num_preemptions", preempted),
        ):
            Counter(f"inhouse:{name}", name, ["model_name"], registry=registry).labels("m").inc(
                value
            )
        return generate_latest(registry).decode()

    readings = ServerReadings()
    assert readings.prefix_cache_hit_rate is None and readings.preemptions is None
    for reading in ((1000, 100, 1), (1400, 400, 1), (3000, 1700, 4)):
        readings.add(read_gauges(exposition(*reading)))
    assert readings.prefix_cache_hit_rate == pytest.approx(1600 / 2000)
    assert readings.preemptions == 3
    data = readings.to_json()
    assert data["prefix_cache_hit_rate"] == pytest.approx(0.8) and "first" not in data
