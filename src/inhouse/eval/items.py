"""Eval sets: JSONL, one item a line, read and checked before anything is sent.

``{"id", "messages" | "prompt", "expected", "grader", "tags", "max_tokens", "tolerance",
"tools", "tool_choice", "response_format"}``; ``id``, a prompt and ``grader`` are required.
An ``image_url`` part may name a file beside the set (``"url": "file:chart.png"``): it is
sent as a data URI, so a set and its images travel as one folder.
"""

from __future__ import annotations

import base64
import json
import mimetypes
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from inhouse.eval.graders import GRADERS, check_expected

DEFAULT_MAX_TOKENS = 64
_KNOWN = frozenset(
    {"id", "messages", "prompt", "expected", "grader", "tags", "max_tokens", "tolerance",
     "tools", "tool_choice", "response_format"}
)  # fmt: skip


class EvalSetError(ValueError):
    """An eval set line that cannot be used; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class EvalItem:
    """One question, how to ask it, and how to grade the answer."""

    id: str
    grader: str
    expected: Any
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    tags: tuple[str, ...] = ()
    max_tokens: int = DEFAULT_MAX_TOKENS
    tolerance: float = 0.0
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


def starter_set() -> Path:
    """The eval set shipped with inhouse (~100 items the bundled SmolLM2 partly passes)."""
    return Path(str(resources.files("inhouse.eval") / "data" / "starter.jsonl"))


def load_eval_set(path: Path) -> list[EvalItem]:
    """Every item of a JSONL eval set, in file order; blank lines and ``//`` lines skipped."""
    items: list[EvalItem] = []
    seen: set[str] = set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("//"):
            continue
        where = f"{path}:{number}"
        try:
            item = with_image_files(parse_item(json.loads(line)), path.parent)
        except json.JSONDecodeError as err:
            raise EvalSetError(f"{where}: not JSON ({err.msg})") from None
        except (ValueError, TypeError) as err:
            raise EvalSetError(f"{where}: {err}") from None
        if item.id in seen:
            raise EvalSetError(f"{where}: id {item.id!r} appears twice")
        seen.add(item.id)
        items.append(item)
    if not items:
        raise EvalSetError(f"{path} has no items")
    return items


def with_image_files(item: EvalItem, folder: Path) -> EvalItem:
    """The item with each ``file:`` image URL read from `folder` into a data URI."""
    if item.messages is None:
        return item
    messages = []
    for message in item.messages:
        content = message.get("content")
        if isinstance(content, list):
            content = [_image_file(part, folder) for part in content]
            message = {**message, "content": content}
        messages.append(message)
    return replace(item, messages=messages)


def _image_file(part: Any, folder: Path) -> Any:
    image = part.get("image_url") if isinstance(part, dict) else None
    url = image.get("url") if isinstance(image, dict) else None
    if not isinstance(url, str) or not url.startswith("file:"):
        return part
    path = folder / url.removeprefix("file:")
    kind = mimetypes.guess_type(path.name)[0]
    if kind is None or not kind.startswith("image/"):
        raise ValueError(f"image {url!r} is not a known image type (.png, .jpg, .webp, .gif)")
    try:
        data = base64.b64encode(path.read_bytes()).decode()
    except OSError as err:
        raise ValueError(f"image {url!r}: {err.strerror}") from None
    return {**part, "image_url": {**image, "url": f"data:{kind};base64,{data}"}}


def parse_item(data: Any) -> EvalItem:
    """One item from its JSON object; ``ValueError`` says which field is wrong."""
    if not isinstance(data, dict):
        raise ValueError("each line must be a JSON object")
    unknown = sorted(data.keys() - _KNOWN)
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r} (known: {', '.join(sorted(_KNOWN))})")
    if not isinstance(data.get("id"), str | int) or data["id"] == "":
        raise ValueError("'id' must be a non-empty string or number")
    messages, prompt = data.get("messages"), data.get("prompt")
    if (messages is None) == (prompt is None):
        raise ValueError("give exactly one of 'messages' and 'prompt'")
    if messages is not None and not (
        isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages)
    ):
        raise ValueError("'messages' must be a non-empty list of message objects")
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError("'prompt' must be a string")
    grader = data.get("grader")
    if grader not in GRADERS:
        raise ValueError(f"'grader' must be one of {', '.join(GRADERS)}, not {grader!r}")
    tags = data.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ValueError("'tags' must be a list of strings")
    max_tokens = data.get("max_tokens", DEFAULT_MAX_TOKENS)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ValueError("'max_tokens' must be a positive integer")
    tolerance = data.get("tolerance", 0.0)
    if not isinstance(tolerance, int | float) or tolerance < 0:
        raise ValueError("'tolerance' must be a number >= 0")
    item = EvalItem(
        id=str(data["id"]),
        grader=grader,
        expected=data.get("expected"),
        messages=messages,
        prompt=prompt,
        tags=tuple(tags),
        max_tokens=max_tokens,
        tolerance=float(tolerance),
        tools=data.get("tools"),
        tool_choice=data.get("tool_choice"),
        response_format=data.get("response_format"),
        raw=data,
    )
    check_expected(item)
    return item
