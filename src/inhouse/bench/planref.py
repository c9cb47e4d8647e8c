"""The plan's predicted max concurrency: read from `inhouse plan --json` output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inhouse.plan.errors import PlanError
from inhouse.plan.planner import PlanInputs, make_plan
from inhouse.plan.source import load_model

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
    """The max concurrent sequences a plan document predicts.

    `memory.max_concurrent_sequences` of `inhouse plan --json`; for other tools' documents, the
    first capacity key found anywhere.
    """
    memory = document.get("memory") if isinstance(document, dict) else None
    if isinstance(memory, dict) and isinstance(memory.get("max_concurrent_sequences"), int):
        return float(memory["max_concurrent_sequences"])
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


def plan_prediction(source: str, gpu: str | None, avg_context: int) -> float:
    """`source` is a plan JSON file, or a model the planner reads, planned for `gpu` at the
    average context (prompt + output tokens) this benchmark sends."""
    path = Path(source)
    if path.is_file() and path.suffix == ".json" and path.name != "config.json":
        return read_plan_file(path)
    if gpu is None:
        raise PlanReferenceError(
            f"--plan {source!r} is not a plan JSON file; to run the planner on it, give --gpu"
        )
    return run_planner(source, gpu, avg_context)


def run_planner(model: str, gpu: str, avg_context: int) -> float:
    """Plan `model` (config.json, folder, GGUF or catalogue name) on `gpu`; its max concurrency."""
    try:
        plan = make_plan(load_model(model), PlanInputs(gpu=gpu, avg_context=avg_context))
    except PlanError as exc:
        raise PlanReferenceError(f"inhouse plan: {exc}") from exc
    return float(plan.max_concurrent)
