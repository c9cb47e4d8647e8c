import pytest

from inhouse.gateway.durations import format_reset, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("90s", 90),
        ("5m", 300),
        ("12h", 43200),
        ("30d", 2592000),
        ("1w", 604800),
        ("250ms", 0.25),
    ],
)
def test_parse(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


def test_parse_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("soon")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.017, "17ms"), (1.0, "1s"), (1.5, "1.5s"), (360, "6m0s"), (3723, "1h2m3s"), (-1, "0ms")],
)
def test_openai_reset_spelling(seconds: float, text: str) -> None:
    assert format_reset(seconds) == text
