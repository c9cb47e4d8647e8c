"""/metrics after traffic, and a client that disconnects mid-stream."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from conftest import RunningServer

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
EMBEDDING_MODEL = "all-MiniLM-L6-v2"


def scrape(server: RunningServer) -> dict[str, float]:
    """Every sample as ``name{label=value,...}`` -> value (model_name checked and dropped:
    the embedding model's series carry its name)."""
    text = httpx.get(f"{server.base_url}/metrics").text
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            embedding = s.name.startswith("inhouse:embedding_")
            assert s.labels.get("model_name") == (EMBEDDING_MODEL if embedding else MODEL), s
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def wait_idle(server: RunningServer, timeout: float = 30) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        now = scrape(server)
        if now["inhouse:num_requests_running"] == 0 and now["inhouse:num_requests_waiting"] == 0:
            return now
        assert time.monotonic() < deadline, "requests still running"
        time.sleep(0.1)


def test_histograms_and_counters_count_the_traffic(server: RunningServer) -> None:
    client = server.client()
    before = wait_idle(server)
    prompts = []
    for i in range(3):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Count to {i + 3}."}],
            max_tokens=5,
            extra_body={"ignore_eos": True},
        )
        assert reply.usage.completion_tokens == 5
        prompts.append(reply.usage.prompt_tokens)
    list(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=4,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    after = wait_idle(server)

    def delta(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    assert delta("inhouse:time_to_first_token_seconds_count") == 4
    assert delta("inhouse:e2e_request_latency_seconds_count") == 4
    assert delta("inhouse:request_queue_time_seconds_count") == 4
    assert delta("inhouse:inter_token_latency_seconds_count") == 3 * 4 + 3
    assert delta("inhouse:generation_tokens_total") == 3 * 5 + 4
    assert delta("inhouse:request_generation_tokens_sum") == 3 * 5 + 4
    assert delta("inhouse:prompt_tokens_total") >= sum(prompts)
    assert delta("inhouse:request_success_total{finished_reason=length}") == 4
    assert delta("inhouse:request_success_total{finished_reason=stop}") == 0
    assert after["inhouse:kv_cache_usage_perc"] == 0
    assert after["inhouse:prefix_cache_queries_total"] >= after["inhouse:prefix_cache_hits_total"]


def test_disconnect_mid_stream_aborts_and_frees_blocks(server: RunningServer) -> None:
    idle = wait_idle(server)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
        "max_tokens": 400,
        "stream": True,
        "ignore_eos": True,
    }
    headers = {"Authorization": "Bearer test-key"}
    with httpx.stream(
        "POST", f"{server.base_url}/v1/chat/completions", json=body, headers=headers, timeout=60
    ) as response:
        lines = response.iter_lines()  # held, so the stream stays open until the block ends
        events = [line for line in (next(lines) for _ in range(6)) if line.startswith("data: ")]
        assert len(events) == 3
        assert scrape(server)["inhouse:num_requests_running"] == 1
    # the connection is closed: the request must stop long before 400 tokens
    after = wait_idle(server, timeout=20)
    assert after["inhouse:kv_cache_usage_perc"] == idle["inhouse:kv_cache_usage_perc"]
    aborted = after["inhouse:request_success_total{finished_reason=abort}"]
    assert aborted == idle["inhouse:request_success_total{finished_reason=abort}"] + 1
    assert after["inhouse:generation_tokens_total"] - idle["inhouse:generation_tokens_total"] < 400


def test_disconnect_before_a_whole_answer_aborts_too(server: RunningServer) -> None:
    idle = wait_idle(server)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a very long story about a cat."}],
        "max_tokens": 400,
        "ignore_eos": True,
    }
    with pytest.raises(httpx.ReadTimeout):
        server.http().post("/v1/chat/completions", json=body, timeout=1.5)
    after = wait_idle(server, timeout=20)
    aborted = after["inhouse:request_success_total{finished_reason=abort}"]
    assert aborted == idle["inhouse:request_success_total{finished_reason=abort}"] + 1
    assert after["inhouse:kv_cache_usage_perc"] == idle["inhouse:kv_cache_usage_perc"]
