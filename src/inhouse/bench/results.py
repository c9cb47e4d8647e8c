"""The results file: config, notes, every run with every request, and the sweep's verdict."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from inhouse.bench.run import RunResult
from inhouse.bench.schema import SCHEMA_VERSION
from inhouse.bench.sweep import Verdict

RESULTS_FILE = "results.json"


def results_document(
    kind: Literal["run", "sweep", "mix"],
    config: dict[str, Any],
    runs: Sequence[RunResult],
    verdict: Verdict | None = None,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """The document `RESULTS_SCHEMA` describes."""
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "config": config,
        "notes": [*notes, *(note for run in runs for note in run.notes)],
        "runs": [run.to_json() for run in runs],
        "sweep": None if verdict is None else verdict.to_json(),
    }


def write_results(document: dict[str, Any], out_dir: Path) -> Path:
    """Write `results.json` into `out_dir` (created if needed) and return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / RESULTS_FILE
    path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return path
