"""Eval sets: the shipped starter set is valid and covers every grader; bad lines are named."""

from __future__ import annotations

import base64
import json
from collections import Counter
from pathlib import Path

import pytest

from inhouse.eval.graders import GRADERS
from inhouse.eval.items import EvalSetError, load_eval_set, starter_set


def test_the_starter_set_loads_and_covers_every_grader() -> None:
    items = load_eval_set(starter_set())
    assert 90 <= len(items) <= 120
    assert set(Counter(i.grader for i in items)) == set(GRADERS)
    tags = Counter(t for i in items for t in i.tags)
    for tag in ("arithmetic", "facts", "extraction", "tools", "classification"):
        assert tags[tag] >= 10, tag
    assert any(i.prompt is not None for i in items)  # the /v1/completions path too


def _set(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "set.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_bad_lines_are_named_with_file_and_line(tmp_path: Path) -> None:
    good = json.dumps({"id": "a", "prompt": "2+2=", "expected": 4, "grader": "numeric"})
    cases = {
        "not JSON": "{",
        "exactly one of 'messages' and 'prompt'": json.dumps(
            {"id": "b", "expected": 1, "grader": "numeric"}
        ),
        "'grader' must be one of": json.dumps(
            {"id": "b", "prompt": "x", "expected": 1, "grader": "fuzzy"}
        ),
        "unknown field 'expect'": json.dumps(
            {"id": "b", "prompt": "x", "expect": 1, "grader": "numeric"}
        ),
        "id 'a' appears twice": good,
    }
    for message, line in cases.items():
        with pytest.raises(EvalSetError, match=rf"set\.jsonl:3: .*{message}"):
            load_eval_set(_set(tmp_path, good, "", line))


def test_an_empty_set_is_refused(tmp_path: Path) -> None:
    with pytest.raises(EvalSetError, match="has no items"):
        load_eval_set(_set(tmp_path, "// only a comment"))


def test_an_image_file_beside_the_set_is_sent_as_a_data_uri(tmp_path: Path) -> None:
    png = b"\x89PNG\r\n\x1a\n" + b"pixels"
    (tmp_path / "chart.png").write_bytes(png)
    image = {"type": "image_url", "image_url": {"url": "file:chart.png", "detail": "low"}}
    asked = [{"type": "text", "text": "Which bar is tallest?"}, image]
    line = {"id": "i", "messages": [{"role": "user", "content": asked}], "expected": "b"}
    line["grader"] = "exact"
    (item,) = load_eval_set(_set(tmp_path, json.dumps(line)))
    part = item.messages[0]["content"][1]
    assert part["image_url"] == {
        "url": "data:image/png;base64," + base64.b64encode(png).decode(),
        "detail": "low",
    }
    for url, message in (("file:missing.png", "No such file"), ("file:set.jsonl", "image type")):
        image["image_url"]["url"] = url
        with pytest.raises(EvalSetError, match=rf"set\.jsonl:1: image .*{message}"):
            load_eval_set(_set(tmp_path, json.dumps(line)))
