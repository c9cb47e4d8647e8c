"""The PNG: accuracy by tag (and overall) for each endpoint, with 95% intervals."""

from __future__ import annotations

from pathlib import Path

from inhouse.eval.compare import EndpointSummary
from inhouse.eval.stats import Proportion

ACCURACY_PNG = "accuracy_by_tag.png"


def plot_accuracy(summaries: list[EndpointSummary], path: Path) -> Path:
    """Grouped bars: one group per tag plus "all", one bar per endpoint, Wilson error bars."""
    # matplotlib: loaded only when this runs, not with the module.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["all", *summaries[0].by_tag]
    width = 0.8 / len(summaries)
    figure, axis = plt.subplots(figsize=(max(6.0, 0.9 * len(labels) + 2), 4.5))
    for index, summary in enumerate(summaries):
        bars: list[Proportion] = [summary.overall, *(summary.by_tag[t] for t in labels[1:])]
        values = [p.value for p in bars]
        errors = [[p.value - p.low for p in bars], [p.high - p.value for p in bars]]
        positions = [i + (index - (len(summaries) - 1) / 2) * width for i in range(len(labels))]
        axis.bar(
            positions,
            values,
            width,
            yerr=errors,
            capsize=3,
            label=f"{summary.endpoint.name} ({summary.endpoint.model})",
        )
    axis.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    axis.set_ylim(0, 1.05)
    axis.set_ylabel("accuracy (95% Wilson interval)")
    axis.set_title("inhouse eval: accuracy by tag")
    axis.legend(loc="upper right", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
