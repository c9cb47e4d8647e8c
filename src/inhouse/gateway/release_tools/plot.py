"""The PNG of `inhouse release compare`: the shadow pairs (agreement, and each yes/no figure
for both releases with its McNemar p-value), the canary's live figures per release, and the
timings of both releases on the same requests; 95 % Wilson intervals throughout."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from inhouse.eval.stats import Proportion

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from inhouse.gateway.release_tools.grade import Grading
    from inhouse.gateway.releases.figures import LiveFigures, ShadowFigures

STABLE, CANDIDATE = "tab:blue", "tab:orange"


def _bars(
    axis: Axes, groups: list[tuple[str, Proportion, Proportion, str]], labels: tuple[str, str]
) -> None:
    """Two bars per group (stable, candidate) with intervals, `n` on each, a note above; a
    side without samples gets no bar and no interval, only "n=0"."""
    for side, (offset, colour, label) in enumerate(
        ((-0.2, STABLE, labels[0]), (0.2, CANDIDATE, labels[1]))
    ):
        shares = [g[1 + side] for g in groups]
        values = [p.value for p in shares]
        # max(0, …): Wilson bounds at 0 % or 100 % sit a rounding error inside the value
        errors = [[max(0.0, p.value - p.low) if p.n else 0.0 for p in shares],
                  [max(0.0, p.high - p.value) if p.n else 0.0 for p in shares]]  # fmt: skip
        positions = [i + offset for i in range(len(groups))]
        axis.bar(positions, values, 0.4, yerr=errors, capsize=3, color=colour, label=label)
        for x, p in zip(positions, shares, strict=True):
            note, top = (f"{p.value:.0%}\nn={p.n}", p.high) if p.n else ("n=0", 0.0)
            axis.annotate(note, (x, top), ha="center", va="bottom", fontsize="x-small")
    for i, (_, _, _, note) in enumerate(groups):
        axis.annotate(note, (i, 1.14), ha="center", fontsize="x-small", color="dimgray")
    axis.set_xticks(range(len(groups)), [g[0] for g in groups])
    axis.set_ylim(0, 1.45)
    axis.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    axis.set_ylabel("share (95% Wilson interval)")
    axis.legend(fontsize="x-small", loc="upper center", ncol=2)


def _p(p_value: float, n: int) -> str:
    return f"McNemar p={p_value:.2g}\n{n} pairs" if n else "no pairs\nwith both"


def plot_compare(
    model: str, stable: int, pairs: ShadowFigures, live: tuple[LiveFigures, LiveFigures],
    grading: Grading | None, path: Path,
) -> Path:  # fmt: skip
    """Write the three panels to `path`."""
    # matplotlib: loaded only when this runs, not with the module.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (paired, canary, times) = plt.subplots(
        1, 3, figsize=(17, 5.2), gridspec_kw={"width_ratios": [3, 2, 2]}
    )
    agreement = pairs.agreement
    groups = [
        ("failed", pairs.primary_errors, pairs.shadow_errors,
         _p(pairs.errors.p_value, pairs.errors.n)),
        ("refusals", pairs.refusals.primary, pairs.refusals.shadow,
         _p(pairs.refusals.paired.p_value, pairs.refusals.paired.n)),
        ("valid JSON\n(json_schema)", pairs.json_valid.primary, pairs.json_valid.shadow,
         _p(pairs.json_valid.paired.p_value, pairs.json_valid.paired.n)),
        ("valid tool\ncalls", pairs.tool_calls_valid.primary, pairs.tool_calls_valid.shadow,
         _p(pairs.tool_calls_valid.paired.p_value, pairs.tool_calls_valid.paired.n)),
    ]  # fmt: skip
    if grading is not None:
        groups.append(("graded right\n(eval set)", grading.stable, grading.candidate,
                       _p(grading.paired.p_value, grading.paired.n)))  # fmt: skip
    _bars(paired, groups, (f"stable {stable}", f"candidate {pairs.release}"))
    paired.set_title(
        f"{pairs.pairs} shadow pairs: identical answers {agreement.value:.0%} "
        f"[{agreement.low:.0%}, {agreement.high:.0%}] of {agreement.n}"
    )
    mine_live, theirs_live = live
    live_groups = [
        ("5xx", mine_live.errors, theirs_live.errors, ""),
        ("refusals", mine_live.refusals, theirs_live.refusals, ""),
        ("valid\nJSON", mine_live.json_valid, theirs_live.json_valid, ""),
        ("valid tool\ncalls", mine_live.tool_calls_valid, theirs_live.tool_calls_valid, ""),
    ]
    live_labels = (f"stable {stable}: {mine_live.requests} requests",
                   f"candidate {theirs_live.release}: {theirs_live.requests}")  # fmt: skip
    _bars(canary, live_groups, live_labels)
    canary.set_title("canary, live (each key on one release: not paired)")
    labels = ["TTFT p50", "TTFT p99", "latency p50", "latency p99"]
    mine = [pairs.primary_ttft_ms.p50, pairs.primary_ttft_ms.p99,
            pairs.primary_latency_ms.p50, pairs.primary_latency_ms.p99]  # fmt: skip
    theirs = [pairs.shadow_ttft_ms.p50, pairs.shadow_ttft_ms.p99,
              pairs.shadow_latency_ms.p50, pairs.shadow_latency_ms.p99]  # fmt: skip
    positions = range(len(labels))
    times.bar([i - 0.2 for i in positions], [v or 0 for v in mine], 0.4, color=STABLE,
              label=f"stable {stable}")  # fmt: skip
    times.bar([i + 0.2 for i in positions], [v or 0 for v in theirs], 0.4, color=CANDIDATE,
              label=f"candidate {pairs.release}")  # fmt: skip
    times.set_xticks(list(positions), labels)
    times.set_ylabel("ms")
    times.set_title("timings on the shadow pairs")
    times.legend(fontsize="x-small")
    figure.suptitle(f"inhouse release compare: {model}, release {pairs.release} vs {stable}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
