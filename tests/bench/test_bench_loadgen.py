import random
import statistics

import pytest

from inhouse.bench.loadgen import LoadShape, arrival_gaps


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_arrivals_have_mean_one_over_rate_and_burstiness_sets_the_spread(
    burstiness: float,
) -> None:
    draw = arrival_gaps(rate=8.0, burstiness=burstiness, rng=random.Random(3))
    gaps = [draw() for _ in range(40_000)]
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / 8, rel=0.03)
    # gamma(shape k): coefficient of variation 1/sqrt(k); Poisson (k = 1) gives 1.
    assert statistics.pstdev(gaps) / mean == pytest.approx(burstiness**-0.5, rel=0.05)


def test_same_seed_same_arrivals() -> None:
    first = arrival_gaps(2.0, 1.0, random.Random(5))
    second = arrival_gaps(2.0, 1.0, random.Random(5))
    assert [first() for _ in range(5)] == [second() for _ in range(5)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_concurrency": 2}, "num_prompts or duration"),
        ({"num_prompts": 3}, "closed loop needs max_concurrency"),
        ({"num_prompts": 3, "max_concurrency": 0}, "at least 1"),
        ({"num_prompts": 3, "request_rate": 0}, "positive"),
        ({"num_prompts": 3, "request_rate": 1, "burstiness": 0}, "burstiness"),
    ],
)
def test_load_shape_rejects_what_cannot_run(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LoadShape(**kwargs)
