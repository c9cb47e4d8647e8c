"""A prompt's images as the engine holds them, and a vision-language model's image side.

The server decodes each image part and hands it to :meth:`ImageSide.prepare`: the model's own
image processor (from its folder) resizes and tiles it, and the prompt gets the processor's
placeholder text in the image's place (tile markers and one image token per encoder row).
Once the prompt is tokenized, :func:`place_images` gives each image the positions of its
image tokens. The runner encodes an image the first time one of its positions is computed
and puts the encoder's rows in place of those tokens' embeddings; a prefix-cache hit over an
image skips its encoding, and the rows of recent images are kept by digest. Each image's
digest is part of the hash of every KV block its tokens touch, so two different images never
share a cached block and the same image does.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from inhouse.engine.errors import EngineInputError
from inhouse.engine.models.idefics3_vision import (
    IMAGE,
    Idefics3Vision,
    idefics3_placeholder,
    load_idefics3_vision,
)

ENCODER_CACHE_BYTES = 64 * 2**20  # recent images' encoder rows: ~15 SmolVLM2 1024 px images


@dataclass(slots=True, eq=False)
class PromptImage:
    """One image of a prompt: its tiles as the processor made them, where its rows go."""

    digest: bytes  # sha256 of the decoded image (mode, size, pixels)
    pixels: torch.Tensor  # [tiles, channels, H, W]
    pixel_mask: torch.Tensor  # [tiles, H, W]
    num_tokens: int  # encoder rows, one per image token
    positions: tuple[int, ...] = ()  # prompt positions of its image tokens, in order
    features: torch.Tensor | None = None  # the encoder's rows, kept until its prompt is in

    def overlaps(self, start: int, end: int) -> bool:
        """Whether any of its tokens lies in positions ``start .. end - 1``."""
        return bool(self.positions) and self.positions[0] < end and self.positions[-1] >= start


def image_block_key(images: Sequence[PromptImage], start: int, end: int) -> bytes:
    """The extra hash key of the KV block over positions ``start .. end - 1``: the digest of
    each image with tokens in it."""
    return b"".join(b"image:" + i.digest for i in images if i.overlaps(start, end))


def place_images(token_ids: Sequence[int], images: list[PromptImage], image_token: int) -> None:
    """Give each image the positions of its image tokens, the prompt's in order (the engine
    refuses a prompt whose image tokens are not exactly its images' rows)."""
    positions = [i for i, t in enumerate(token_ids) if t == image_token]
    start = 0
    for image in images:
        image.positions = tuple(positions[start : start + image.num_tokens])
        start += image.num_tokens


class ImageSide:
    """A vision-language model's image processor and encoder."""

    def __init__(
        self,
        processor: Any,
        tower: Idefics3Vision,
        image_token: str,
        image_token_id: int,
        placeholder: Callable[[int, int], str],
    ) -> None:
        self.processor = processor  # transformers' image processor, from the model folder
        self.tower = tower
        self.image_token = image_token
        self.image_token_id = image_token_id
        self._placeholder = placeholder  # (rows, cols) of tiles -> the prompt text
        self.encoded = 0  # images encoded so far, and the seconds that took (for /metrics)
        self.encode_seconds = 0.0
        self._recent: OrderedDict[bytes, torch.Tensor] = OrderedDict()  # by digest, LRU
        self._recent_bytes = 0

    def prepare(self, image: Any) -> tuple[PromptImage, str]:
        """A PIL image as the processor resizes and tiles it, and the text that stands for it
        in the prompt."""
        out = self.processor(images=[[image]], return_row_col_info=True, return_tensors="pt")
        pixels, mask = out["pixel_values"][0], out["pixel_attention_mask"][0]
        digest = hashlib.sha256(f"{image.mode}:{image.size}:".encode())
        digest.update(image.tobytes())
        prepared = PromptImage(
            digest=digest.digest(),
            pixels=pixels,
            pixel_mask=mask.bool(),
            num_tokens=pixels.shape[0] * self.tower.tokens_per_tile,
        )
        return prepared, self._placeholder(out["rows"][0][0], out["cols"][0][0])

    def with_placeholders(self, text: str, pictures: list[Any]) -> tuple[str, list[PromptImage]]:
        """A rendered prompt with the image token the chat template wrote for each picture
        replaced by that picture's placeholder, and the pictures prepared; EngineInputError
        when the count differs (the text wrote the token itself) or the processor refuses."""
        pieces = text.split(self.image_token)
        if len(pieces) - 1 != len(pictures):
            raise EngineInputError(
                f"the chat template wrote the image token {self.image_token!r} "
                f"{len(pieces) - 1} times for {len(pictures)} image parts: the text must "
                "not contain it"
            )
        prepared, texts = [], [pieces[0]]
        for picture, after in zip(pictures, pieces[1:], strict=True):
            try:
                image, placeholder = self.prepare(picture)
            except Exception as exc:  # the processor's own refusal of an odd image
                raise EngineInputError(
                    f"the model's image processor cannot take a {picture.size} image ({exc})"
                ) from None
            prepared.append(image)
            texts += [placeholder, after]
        return "".join(texts), prepared

    def encode(self, image: PromptImage) -> torch.Tensor:
        """The image's rows in the decoder's embedding space: those of the same image encoded
        lately (kept up to :data:`ENCODER_CACHE_BYTES`, as vLLM's encoder cache keeps them: a
        prefix-cache hit that ends inside an image needs its last rows again), else
        computed."""
        if image.features is not None:
            return image.features
        features = self._recent.get(image.digest)
        if features is None:
            started = time.perf_counter()
            features = self.tower(image.pixels, image.pixel_mask)
            self.encode_seconds += time.perf_counter() - started
            self.encoded += 1
            self._keep(image.digest, features)
        else:
            self._recent.move_to_end(image.digest)
        image.features = features
        return features

    def _keep(self, digest: bytes, features: torch.Tensor) -> None:
        size = features.numel() * features.element_size()
        if size > ENCODER_CACHE_BYTES:
            return
        self._recent[digest] = features
        self._recent_bytes += size
        while self._recent_bytes > ENCODER_CACHE_BYTES:
            _, dropped = self._recent.popitem(last=False)
            self._recent_bytes -= dropped.numel() * dropped.element_size()


def load_image_side(folder: Path, config: Any, tokenizer: Any, dtype: torch.dtype) -> ImageSide:
    """The image side of the vision-language checkpoint in ``folder`` (one of
    ``SERVED_MODEL_TYPES``; ``config``: its transformers config), its encoder in ``dtype``."""
    from transformers import AutoImageProcessor

    tower = load_idefics3_vision(folder, config, dtype)
    token = IMAGE
    token_id = tokenizer.convert_tokens_to_ids(token)
    if getattr(config, "image_token_id", token_id) != token_id:
        raise ValueError(f"{folder}: the tokenizer's {token} is not config's image_token_id")
    tokens_per_tile = tower.tokens_per_tile

    def placeholder(rows: int, cols: int) -> str:
        return idefics3_placeholder(rows, cols, tokens_per_tile)

    processor = AutoImageProcessor.from_pretrained(folder)
    return ImageSide(processor, tower, token, token_id, placeholder)


def gather_image_rows(
    entries: Sequence[tuple[Sequence[PromptImage], int, int]], encode: Callable
) -> tuple[list[int], list[torch.Tensor]]:
    """For a step's entries ``(images, first position, rows)`` laid out one after another,
    the flat rows that take image features and the features, in the same order."""
    rows: list[int] = []
    features: list[torch.Tensor] = []
    base = 0
    for images, start, count in entries:
        end = start + count
        for image in images:
            if not image.overlaps(start, end):
                continue
            inside = [(k, p) for k, p in enumerate(image.positions) if start <= p < end]
            if not inside:  # the step falls between two of its tiles
                continue
            rows.extend(base + p - start for _, p in inside)
            features.append(encode(image)[inside[0][0] : inside[-1][0] + 1])
            if image.positions[-1] < end:  # its last row goes in now: its prompt needs no more
                image.features = None
        base += count
    return rows, features
