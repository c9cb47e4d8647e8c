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


def test_replicas_behind_a_gateway_are_read_and_added_up() -> None:
    """`--metrics-url` once per replica: two real HTTP servers, each serving a replica's
    exposition; counters and queues add up, KV usage is the fullest replica's."""
    import asyncio
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import httpx

    from inhouse.bench.scrape import MetricsScraper

    pages = {"a": (100.0, 10.0, 0.2), "b": (300.0, 200.0, 0.7)}

    def exposition(queries: float, hits: float, kv: float) -> bytes:
        registry = CollectorRegistry()
        Counter("inhouse:prefix_cache_queries", "q", registry=registry).inc(queries)
        Counter("inhouse:prefix_cache_hits", "h", registry=registry).inc(hits)
        Gauge("inhouse:kv_cache_usage_perc", "kv", registry=registry).set(kv)
        Gauge("inhouse:num_requests_waiting", "w", registry=registry).set(1)
        return generate_latest(registry)

    def server(name: str) -> ThreadingHTTPServer:
        class Page(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = exposition(*pages[name])
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        running = ThreadingHTTPServer(("127.0.0.1", 0), Page)
        threading.Thread(target=running.serve_forever, daemon=True).start()
        return running

    servers = {name: server(name) for name in pages}
    urls = tuple(f"http://127.0.0.1:{s.server_address[1]}" for s in servers.values())

    async def run() -> MetricsScraper:
        async with httpx.AsyncClient(base_url="http://127.0.0.1:9") as http:
            scraper = MetricsScraper(http, interval=60, urls=urls)
            async with scraper:
                pages["a"], pages["b"] = (500.0, 400.0, 0.3), (700.0, 600.0, 0.9)
            return scraper

    try:
        readings = asyncio.run(run()).readings
    finally:
        for running in servers.values():
            running.shutdown()
    assert readings.error is None and readings.samples == 2
    assert readings.prefix_cache_hit_rate == pytest.approx((1000 - 210) / (1200 - 400))
    assert readings.kv_cache_usage_peak == pytest.approx(0.9) and readings.waiting_peak == 2
