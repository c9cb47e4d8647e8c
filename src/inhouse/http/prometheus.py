"""Reading a Prometheus text exposition (`GET /metrics`) with prometheus_client's parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def sample_totals(text: str) -> dict[str, float]:
    """Each sample name's value summed over its label sets (`x_total`, `x_bucket` and the
    like keep their suffix); ValueError if the page is not a valid exposition."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return totals
