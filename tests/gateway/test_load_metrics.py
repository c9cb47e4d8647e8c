"""The router's load reading in each engine's own metric names."""

from __future__ import annotations

import pytest

from inhouse.gateway.backends import read_busy, read_load

PAGES = {
    "vllm": """# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 3.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 8.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.75
""",
    "sglang": """# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 3.0
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 8.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.75
""",
    "llama.cpp": """# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 8
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
""",
}


@pytest.mark.parametrize("kind", sorted(PAGES))
def test_each_engine_is_read_in_its_own_names(kind: str) -> None:
    waiting, kv = read_load(PAGES[kind], kind)
    assert waiting == 3.0
    assert kv == (0.0 if kind == "llama.cpp" else 0.75)


def test_another_engines_names_are_not_taken_for_load() -> None:
    assert read_load(PAGES["vllm"], "sglang") == (0.0, 0.0)
    assert read_load(PAGES["vllm"].replace("kv_cache", "gpu_cache"), "vllm") == (3.0, 0.75)


@pytest.mark.parametrize("kind", sorted(PAGES))
def test_work_running_or_waiting_reads_as_busy(kind: str) -> None:
    assert read_busy(PAGES[kind], kind)
    idle = "".join(
        line.rsplit(" ", 1)[0] + " 0\n" if not line.startswith("#") else line + "\n"
        for line in PAGES[kind].splitlines()
    )
    assert not read_busy(idle, kind)
