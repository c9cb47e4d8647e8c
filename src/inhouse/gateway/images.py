"""A chat request's images, checked at the gateway before any upstream sees them.

Seed 004's troubleshooting table lists the three 400s an image request gets: a content part
whose ``type`` is not ``image_url``, a ``url`` that is not a valid data URI, more images than
``--limit-mm-per-prompt``. Each gets its own message here. An ``http(s)`` URL is refused
unless its host is in ``gateway.image_url_hosts``: a server that fetches the URLs clients
name is an SSRF door into the network it runs in. The images themselves are never kept:
only their count reaches the audit and the usage.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

# The gateway's default body cap: base64 makes an image a third larger (seed 004: a 2 MB
# photo is 2.7 MB of JSON), so four of them pass 8 MiB; the seed's nginx takes 20m.
IMAGE_BODY_BYTES = 20 * 2**20
OTHER_SPELLINGS = ("image", "input_image")  # other APIs' names for a chat image part
DATA_URI = re.compile(r"data:(image/[a-z0-9.+-]+);base64,", re.IGNORECASE)
PART_EXAMPLE = '{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}'


class ImageRefused(ValueError):
    """An image part the gateway will not pass on (answered with 400)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


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
        _check_url(url, url_hosts, f"{param}.image_url.url")
        count += 1
    return count


def _check_url(url: str, url_hosts: frozenset[str], param: str) -> None:
    if url[:5].lower() == "data:":
        header = DATA_URI.match(url)
        if header is None:
            raise ImageRefused(
                "image_url.url is not a valid data URI of an image: it must start "
                "'data:image/<type>;base64,' (e.g. data:image/png;base64,iVBOR...)",
                param,
            )
        try:
            base64.b64decode(url[header.end() :], validate=True)
        except (binascii.Error, ValueError):
            raise ImageRefused(
                "image_url.url is not a valid data URI of an image: its data is not base64",
                param,
            ) from None
        return
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:  # "https://[::1": not a URL at all
        parts, host = None, None
    if parts is None or parts.scheme.lower() not in ("http", "https") or not host:
        raise ImageRefused(
            "image_url.url must be a data URI of the image (data:image/png;base64,...)",
            param,
        )
    if host.lower() not in url_hosts:
        raise ImageRefused(
            f"image URLs are not fetched from {host!r}: send the image as a data "
            "URI (data:image/png;base64,...), or allow its host in gateway.image_url_hosts",
            param,
        )


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


def images_limit_message(count: int, limit: int, whose: str, setting: str) -> str:
    """The 400 for too many images, naming the limit, whose it is and the setting."""
    return f"{count} images in one request: {whose} takes at most {limit} (its {setting})"
