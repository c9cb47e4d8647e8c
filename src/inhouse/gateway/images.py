"""A chat request's images, checked at the gateway before any upstream sees them.

Seed 004's troubleshooting table lists the three 400s an image request gets: a content part
whose ``type`` is not ``image_url``, a ``url`` that is not a valid data URI, more images than
``--limit-mm-per-prompt``. Each gets its own message here. An ``http(s)`` URL is refused
unless its host is in ``gateway.image_url_hosts`` (see :mod:`inhouse.api.image_url`). The
images themselves are never kept: only their count reaches the audit and the usage.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from inhouse.api.image_url import PART_EXAMPLE, ImageRefused, image_source

OTHER_SPELLINGS = ("image", "input_image")  # other APIs' names for a chat image part


def image_parts(messages: list[Any]) -> Iterable[tuple[int, int, dict[str, Any]]]:
    """(message index, part index, part) of each content part that is (or means to be) an
    image."""
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") in ("image_url", *OTHER_SPELLINGS):
                yield i, j, part


def count_images(messages: list[Any], url_hosts: frozenset[str]) -> int:
    """The request's image parts, each checked; ImageRefused for the first that is not
    a well-formed data URI of an image or an http(s) URL on an allowed host."""
    count = 0
    for i, j, part in image_parts(messages):
        param = f"messages[{i}].content[{j}]"
        if part["type"] != "image_url":
            raise ImageRefused(
                f"content part type {part['type']!r} is not a chat completions part: "
                f"an image is {PART_EXAMPLE}",
                f"{param}.type",
            )
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else None
        if not isinstance(url, str):
            raise ImageRefused(
                f"an image_url part needs image_url.url, a string: {PART_EXAMPLE}",
                f"{param}.image_url",
            )
        image_source(url, url_hosts, f"{param}.image_url.url", "gateway.image_url_hosts")
        count += 1
    return count


def without_images(messages: list[Any]) -> list[Any]:
    """The messages with each image part's URL replaced by a note of its length."""
    kept = list(messages)
    for i, j, part in list(image_parts(messages)):
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else None
        note = f"<image: {len(url)} characters, not kept>" if isinstance(url, str) else None
        if kept[i] is messages[i]:
            kept[i] = {**messages[i], "content": list(messages[i]["content"])}
        kept[i]["content"][j] = {**part, "image_url": {"url": note}}
    return kept
