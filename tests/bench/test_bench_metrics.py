import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inhouse.bench.metrics import Distribution, Slo, parse_seconds, parse_slo, percentile, summarize
from inhouse.bench.requests import RequestRecord


def _record(index: int, ttft: float, chunks: list[float], tokens: int, **extra) -> RequestRecord:
    return RequestRecord(
        index=index,
        start=0.0,
        status=200,
        ttft=ttft,
        e2e=chunks[-1] if chunks else ttft,
        chunk_times=chunks,
        output_tokens=tokens,
        prompt_tokens=10,
        token_source="usage",
        **extra,
    )


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=60), st.floats(0, 100))
def test_percentile_matches_numpy_linear(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(np.percentile(values, q), rel=1e-9, abs=1e-9)


def test_percentile_rejects_empty_and_out_of_range() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_distribution_of_nothing_is_all_none() -> None:
    assert Distribution.of([]) == Distribution(0, None, None, None, None, None, None)


def test_tpot_excludes_first_token_as_vllm() -> None:
    # First token after 1 s, then 4 more tokens over 0.4 s: TPOT is 0.1 s, not 1.4/5.
    record = _record(0, 1.0, [1.0, 1.1, 1.2, 1.3, 1.4], tokens=5)
    assert record.tpot == pytest.approx(0.1)
    assert record.itl == pytest.approx([0.1, 0.1, 0.1, 0.1])
    assert _record(1, 1.0, [1.0], tokens=1).tpot is None


def test_tpot_uses_usage_tokens_not_chunks() -> None:
    # Two chunks carrying 9 tokens between them (a server that batches deltas).
    record = _record(0, 0.5, [0.5, 1.3], tokens=9)
    assert record.tpot == pytest.approx(0.1)
    assert record.itl == pytest.approx([0.8])


def test_summary_counts_failures_by_outcome_and_keeps_latencies_of_successes() -> None:
    ok = [
        _record(i, 0.1 * (i + 1), [0.1 * (i + 1), 0.1 * (i + 1) + 0.5], tokens=6) for i in range(4)
    ]
    failed = [
        RequestRecord(index=10, start=0, status=429, error="http: slow down"),
        RequestRecord(index=11, start=0, status=503, error="http: overloaded"),
        RequestRecord(index=12, start=0, status=503, error="http: overloaded"),
        RequestRecord(index=13, start=0, error="timeout: no complete answer within 1 s"),
        RequestRecord(index=14, start=0, status=200, error="connection: RemoteProtocolError"),
    ]
    summary = summarize(ok + failed, duration=2.0, slo=Slo(ttft=0.25))
    assert summary.completed == 4 and summary.failed == 5
    assert summary.failures == {"connection": 1, "http_429": 1, "http_503": 2, "timeout": 1}
    assert summary.ttft.count == 4 and summary.ttft.mean == pytest.approx(0.25)
    assert summary.tpot.mean == pytest.approx(0.1)
    assert summary.total_output_tokens == 24 and summary.output_throughput == pytest.approx(12)
    assert summary.total_token_throughput == pytest.approx((24 + 40) / 2)
    assert summary.request_throughput == pytest.approx(2.0)
    assert summary.slo_met == 2 and summary.goodput == pytest.approx(1.0)


def test_goodput_is_absent_without_slo() -> None:
    summary = summarize([_record(0, 0.1, [0.1, 0.2], 2)], duration=1.0, slo=Slo())
    assert summary.goodput is None and summary.slo_met is None


def test_parse_slo_units() -> None:
    assert parse_slo("ttft=500ms, tpot=0.05s,e2e=10s") == Slo(ttft=0.5, tpot=0.05, e2e=10.0)
    assert parse_seconds("250") == 0.25
    for bad in ("ttft", "speed=1s", "ttft=fast"):
        with pytest.raises(ValueError):
            parse_slo(bad)
