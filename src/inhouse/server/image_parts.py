"""A chat request's images, read for a vision-language model: each ``image_url`` part's data URI
decoded (or its http(s) URL fetched, where ``--allowed-media-domains`` names the host, with
no redirect followed), opened by Pillow and converted to RGB. Anything that is not an image
Pillow can read, or one larger than :data:`MAX_IMAGE_PIXELS`, is a 400 naming its part.
"""

from __future__ import annotations

import io
import urllib.error
import urllib.request
from typing import Any

from inhouse.api.chat import ChatMessage, ImagePart
from inhouse.api.image_url import ImageRefused, image_source

MAX_IMAGE_PIXELS = 64_000_000  # a 8000 x 8000 photo; a model resizes it to ~1-2 MP anyway
FETCH_TIMEOUT_S = 10.0
FETCH_BYTES = 20 * 2**20
SETTING = "inhouse serve --allowed-media-domains"


def image_part_indices(messages: list[ChatMessage]) -> list[tuple[int, int, ImagePart]]:
    """(message index, part index, part) of each image part, in prompt order."""
    return [
        (i, j, part)
        for i, message in enumerate(messages)
        if isinstance(message.content, list)
        for j, part in enumerate(message.content)
        if isinstance(part, ImagePart)
    ]


def read_image(part: ImagePart, url_hosts: frozenset[str], param: str) -> Any:
    """The part's image as an RGB ``PIL.Image``; ImageRefused (a 400) if it is none."""
    from PIL import Image

    param = f"{param}.image_url.url"
    source = image_source(part.image_url.url, url_hosts, param, SETTING)
    data = source if isinstance(source, bytes) else _fetch(source, param)
    try:
        image = Image.open(io.BytesIO(data))  # reads the header only
    except Image.UnidentifiedImageError:
        raise ImageRefused(
            "image_url.url holds no image Pillow can read: its bytes are in no image format "
            "it knows (PNG, JPEG, WebP, GIF, ...)",
            param,
        ) from None
    except Exception as exc:  # Pillow's decoders raise many kinds on a damaged or odd file
        raise _unreadable(exc, param) from None
    with image:
        width, height = image.size
        if width * height > MAX_IMAGE_PIXELS:
            raise ImageRefused(
                f"the image is {width} x {height} pixels; at most {MAX_IMAGE_PIXELS:,} are "
                "read: scale it down first",
                param,
            )
        try:
            return image.convert("RGB")  # decodes it
        except Exception as exc:  # a damaged body behind a good header
            raise _unreadable(exc, param) from None


def _unreadable(exc: Exception, param: str) -> ImageRefused:
    return ImageRefused(f"image_url.url holds no image Pillow can read ({exc})", param)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is refused: it could lead from an allowed host to any other."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def _fetch(url: str, param: str) -> bytes:
    opener = urllib.request.build_opener(_NoRedirects)
    try:
        with opener.open(url, timeout=FETCH_TIMEOUT_S) as response:
            data = response.read(FETCH_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ImageRefused(f"the image at {url!r} could not be fetched ({exc})", param) from None
    if len(data) > FETCH_BYTES:
        raise ImageRefused(f"the image at {url!r} is over {FETCH_BYTES:,} bytes", param)
    return data
