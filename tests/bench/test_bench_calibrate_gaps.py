"""A decode probe's step time comes from the gaps while all its requests stream together."""

from __future__ import annotations

from inhouse.bench.calibrate import _decode_point
from inhouse.bench.requests import RequestRecord


def _record(index: int, chunk_times: list[float]) -> RequestRecord:
    return RequestRecord(index=index, start=0.0, status=200, chunk_times=chunk_times)


def test_a_request_that_starts_late_leaves_the_lone_steps_out() -> None:
    # The first request decodes alone at 6 ms a step until the second's prefill (50 ms); then
    # both decode at 12 ms a step; the second finishes alone at 6 ms.
    first = [0.0, 0.006, 0.012, 0.018, 0.024, 0.030, 0.080, 0.092, 0.104, 0.116]
    second = [0.080, 0.092, 0.104, 0.116, 0.122, 0.128, 0.134, 0.140, 0.146, 0.152]
    records = [_record(0, first), _record(1, second)]
    point = _decode_point(records, prompt=64, output=10)
    assert point.batch == 2
    assert abs(point.step - 0.012) < 1e-9  # all six gaps in [0.080, 0.116] are 12 ms
    # Every gap counted, the lone ones would carry the median: 5 of 18 are 12 ms
    everything = sorted(gap for r in records for gap in r.itl)
    assert abs(everything[len(everything) // 2] - 0.006) < 1e-9


def test_requests_that_never_overlap_fall_back_to_all_their_gaps() -> None:
    point = _decode_point(
        [_record(0, [0.0, 0.01, 0.02]), _record(1, [0.05, 0.06, 0.07])], prompt=64, output=3
    )
    assert abs(point.step - 0.01) < 1e-9
