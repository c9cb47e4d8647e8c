import pytest

from inhouse.wire.auth import auth_headers, error_body, error_message
from inhouse.wire.prometheus import sample_totals

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


def test_auth_and_error_bodies() -> None:
    assert auth_headers("k") == {"Authorization": "Bearer k"} and auth_headers(None) == {}
    body = error_body("no", "server_error", "x")
    assert body == {"error": {"message": "no", "type": "server_error", "param": None, "code": "x"}}
    assert error_message(b'{"error": {"message": "no"}}') == "no"
    assert error_message(b'{"detail": "gone"}') == "gone"
    assert error_message(b"<h1>Bad Gateway</h1>") == "<h1>Bad Gateway</h1>"
