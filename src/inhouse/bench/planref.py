"""The plan's predicted max concurrency: read from `inhouse plan --json` output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Keys under which a plan states its computed capacity, most specific first.
CAPACITY_KEYS = ("max_concurrent_sequences", "max_concurrency", "max_concurrent")


class PlanReferenceError(ValueError):
    """The plan could not be read or holds no capacity figure."""


def _find(document: Any, key: str) -> float | None:
    if isinstance(document, dict):
        value = document.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        for child in document.values():
            found = _find(child, key)
            if found is not None:
                return found
    elif isinstance(document, list):
        for child in document:
            found = _find(child, key)
            if found is not None:
                return found
    return None


def predicted_concurrency(document: Any) -> float:
    """The max concurrent sequences a plan document predicts (first capacity key found)."""
    for key in CAPACITY_KEYS:
        value = _find(document, key)
        if value is not None:
            return value
    raise PlanReferenceError(f"the plan holds none of {', '.join(CAPACITY_KEYS)}")


def read_plan_file(path: Path) -> float:
    """The prediction in a file written by `inhouse plan --json`."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PlanReferenceError(f"cannot read plan {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise PlanReferenceError(
            f"{path} is not JSON ({exc.msg}); use `inhouse plan --json`"
        ) from exc
    return predicted_concurrency(document)


def plan_prediction(source: str, gpu: str | None) -> float:
    """`source` is a plan JSON file, or a model the planner knows, planned for `gpu`."""
    path = Path(source)
    if path.is_file():
        return read_plan_file(path)
    if gpu is None:
        raise PlanReferenceError(
            f"--plan {source!r} is not a file; to run the planner for a model, give --gpu too"
        )
    return run_planner(source, gpu)


def run_planner(model: str, gpu: str) -> float:
    """Plan `model` on `gpu` with the defaults of `inhouse plan` and return its capacity."""
    raise PlanReferenceError("running the planner from bench needs inhouse.plan (not yet here)")
