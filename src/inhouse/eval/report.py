"""The eval report: a console table, a JSON file, and (in plot.py) a PNG."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from inhouse.eval.client import ItemResult
from inhouse.eval.compare import Comparison, EndpointSummary
from inhouse.eval.items import EvalItem
from inhouse.eval.stats import Proportion

REPORT_JSON = "report.json"
FLIPS_SHOWN = 20


@dataclass(frozen=True, slots=True)
class EvalReport:
    """Everything one `inhouse eval` run found."""

    eval_set: str
    items: list[EvalItem]
    summaries: list[EndpointSummary]
    results: list[list[ItemResult]]  # per endpoint, in item order
    comparison: Comparison | None

    def to_json(self) -> dict[str, Any]:
        """The report as plain JSON values (every item's answers included)."""
        out: dict[str, Any] = {
            "eval_set": self.eval_set,
            "items": len(self.items),
            "endpoints": [_summary_json(s) for s in self.summaries],
            "per_item": [
                {
                    "id": item.id,
                    "grader": item.grader,
                    "tags": list(item.tags),
                    **{
                        s.endpoint.name: dataclasses.asdict(results[i])
                        for s, results in zip(self.summaries, self.results, strict=True)
                    },
                }
                for i, item in enumerate(self.items)
            ],
        }
        if self.comparison is not None:
            paired = self.comparison.paired
            out["comparison"] = {
                "a": self.summaries[0].endpoint.name,
                "b": self.summaries[1].endpoint.name,
                "paired_difference": dataclasses.asdict(paired),
                "mcnemar_exact_p": paired.p_value,
                "right_to_wrong": self.comparison.right_to_wrong,
                "wrong_to_right": self.comparison.wrong_to_right,
            }
        return out

    def write_json(self, out_dir: Path) -> Path:
        path = out_dir / REPORT_JSON
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        return path


def _proportion_json(p: Proportion) -> dict[str, Any]:
    return {"correct": p.k, "n": p.n, "accuracy": p.value, "ci95": [p.low, p.high]}


def _summary_json(s: EndpointSummary) -> dict[str, Any]:
    return {
        "name": s.endpoint.name,
        "url": s.endpoint.url,
        "model": s.endpoint.model,
        "accuracy": _proportion_json(s.overall),
        "by_grader": {k: _proportion_json(v) for k, v in s.by_grader.items()},
        "by_tag": {k: _proportion_json(v) for k, v in s.by_tag.items()},
        "errors": s.errors,
        "latency_p50_s": s.latency_p50_s,
        "latency_mean_s": s.latency_mean_s,
        "prompt_tokens_mean": s.prompt_tokens_mean,
        "completion_tokens_mean": s.completion_tokens_mean,
    }


def _cell(p: Proportion) -> str:
    return f"{p.value:6.1%} [{p.low:.0%}–{p.high:.0%}] {p.k}/{p.n}"


def _number(value: float | None, scale: float = 1.0, fmt: str = ".0f") -> str:
    return "-" if value is None else format(value * scale, fmt)


def print_report(report: EvalReport, console: Console) -> None:
    """Accuracy by grader and tag per endpoint, costs, then the paired comparison and flips."""
    table = Table(title=f"inhouse eval: {report.eval_set} ({len(report.items)} items)")
    table.add_column("", style="bold")
    for s in report.summaries:
        table.add_column(f"{s.endpoint.name}\n{s.endpoint.model}", justify="right")
    rows: list[tuple[str, list[str]]] = [("all", [_cell(s.overall) for s in report.summaries])]
    first = report.summaries[0]
    rows += [
        (f"grader {g}", [_cell(s.by_grader[g]) for s in report.summaries]) for g in first.by_grader
    ]
    rows += [(f"tag {t}", [_cell(s.by_tag[t]) for s in report.summaries]) for t in first.by_tag]
    rows += [
        ("errors", [str(s.errors) for s in report.summaries]),
        ("latency p50 ms", [_number(s.latency_p50_s, 1000) for s in report.summaries]),
        (
            "prompt tokens/item",
            [_number(s.prompt_tokens_mean, fmt=".1f") for s in report.summaries],
        ),
        (
            "output tokens/item",
            [_number(s.completion_tokens_mean, fmt=".1f") for s in report.summaries],
        ),
    ]
    for label, cells in rows:
        table.add_row(label, *cells)
    console.print(table)
    if report.comparison is None:
        return
    a, b = (s.endpoint.name for s in report.summaries)
    paired, flips = report.comparison.paired, report.comparison
    console.print(
        f"paired difference {b} − {a}: {paired.diff:+.1%} "
        f"[{paired.low:+.1%}, {paired.high:+.1%}] over {paired.n} items; "
        f"{paired.a_only} right→wrong, {paired.b_only} wrong→right; "
        f"exact McNemar p = {paired.p_value:.3g}"
    )
    if flips.right_to_wrong:
        shown = ", ".join(flips.right_to_wrong[:FLIPS_SHOWN])
        more = len(flips.right_to_wrong) - FLIPS_SHOWN
        console.print(
            f"right on {a}, wrong on {b}: {shown}" + (f" (+{more} more)" if more > 0 else "")
        )
