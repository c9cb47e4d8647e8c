"""Where a chat image part's ``image_url.url`` points, checked the same way by the gateway and
the server: a data URI of an image (its bytes decoded), or an ``http(s)`` URL on a host an
allow-list names. A server that fetches any URL a client names is an SSRF door into the
network it runs in, so every other URL is refused with its own message.
"""

from __future__ import annotations

import base64
import binascii
import re
from urllib.parse import urlsplit

DATA_URI = re.compile(r"data:(image/[a-z0-9.+-]+);base64,", re.IGNORECASE)
PART_EXAMPLE = '{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}'


class ImageRefused(ValueError):
    """An image part that is not served (answered with 400); ``param`` says where it is."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def image_source(url: str, url_hosts: frozenset[str], param: str, setting: str) -> bytes | str:
    """A data URI's decoded bytes, or the URL itself when it is http(s) on an allowed host;
    ImageRefused otherwise (``setting``: where the allow-list is set, for the message)."""
    if url[:5].lower() == "data:":
        header = DATA_URI.match(url)
        if header is None:
            raise ImageRefused(
                "image_url.url is not a valid data URI of an image: it must start "
                "'data:image/<type>;base64,' (e.g. data:image/png;base64,iVBOR...)",
                param,
            )
        try:
            return base64.b64decode(url[header.end() :], validate=True)
        except (binascii.Error, ValueError):
            raise ImageRefused(
                "image_url.url is not a valid data URI of an image: its data is not base64",
                param,
            ) from None
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
            f"URI (data:image/png;base64,...), or allow its host in {setting}",
            param,
        )
    return url


def images_limit_message(count: int, limit: int, whose: str, setting: str) -> str:
    """The 400 for too many images, naming the limit, whose it is and the setting."""
    return f"{count} images in one request: {whose} takes at most {limit} (its {setting})"
