"""Answers kept as they arrive (one JSONL file per endpoint), so an interrupted run resumes:
an item answered before under the same endpoint, model, settings and item text is not asked
again; one that failed is."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from inhouse.eval.client import Endpoint, ItemResult, Settings
from inhouse.eval.items import EvalItem


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


class ResultStore:
    """Append-only answers of one endpoint under ``out_dir``."""

    def __init__(self, out_dir: Path, endpoint: Endpoint, settings: Settings) -> None:
        safe = re.sub(r"[^\w.-]", "_", endpoint.name)
        self.path = out_dir / f"answers-{safe}.jsonl"
        self._run = _digest([endpoint.root, endpoint.model, settings.key()])

    def _key(self, item: EvalItem) -> str:
        return _digest([self._run, item.raw])

    def answered(self, items: list[EvalItem]) -> dict[str, ItemResult]:
        """Stored answers (no error) that still match the item and the run, by item id."""
        if not self.path.is_file():
            return {}
        wanted = {self._key(item): item.id for item in items}
        found: dict[str, ItemResult] = {}
        for line in self.path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a line cut short when the run was interrupted
            item_id = wanted.get(row.pop("key", None))
            if item_id is None or row.get("error") is not None:
                continue
            row["tool_calls"] = [tuple(c) for c in row.get("tool_calls", [])]
            found[item_id] = ItemResult(**row)
        return found

    def append(self, item: EvalItem, result: ItemResult) -> None:
        """Write one answer and flush it to disk."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        row = {"key": self._key(item), **dataclasses.asdict(result)}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
