import pytest

from inhouse.http.prometheus import sample_totals

PAGE = """# HELP vllm:num_requests_waiting Waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="a"} 2.0
vllm:num_requests_waiting{model_name="b"} 1.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="a"} 40.0
untyped_thing 3
"""


def test_samples_are_summed_over_label_sets_by_their_own_name() -> None:
    totals = sample_totals(PAGE)
    assert totals["vllm:num_requests_waiting"] == 3.0
    assert totals["vllm:prefix_cache_hits_total"] == 40.0
    assert totals["untyped_thing"] == 3.0


def test_a_page_that_is_not_an_exposition_is_refused() -> None:
    with pytest.raises(ValueError):
        sample_totals("<html>not metrics</html>\n")
