"""A vision-language model's image encoder, from its config: the parameters it keeps resident,
the tokens an image becomes at its processor's resize policy, and the memory encoding takes.

Seed 004: the encoder "often holds a few hundred MB to 1–2 GB on its own, and is forgotten, so
the budget does not add up". Three families, each counted from the shapes as transformers
builds them (checked against its modules' own parameter counts):

- Qwen2-VL and Qwen2.5-VL: a ViT over 14-pixel patches of the image at its own size (within
  the processor's pixel bounds, sides rounded to 28), 2 × 2 patches merged into one token;
- Idefics3 and SmolVLM: a SigLIP-style encoder over square tiles (the image scaled to the
  processor's longest edge, cut into tiles of the encoder's size, plus the whole image as one
  more tile), each tile's patches pixel-shuffled into ``image_seq_len`` tokens;
- LLaVA: a CLIP encoder over the image resized to its one square size, a token a patch.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from inhouse.plan.errors import PlanError

DEFAULT_IMAGES_PER_PROMPT = 4  # seed 004's `--limit-mm-per-prompt '{"image": 4}'`
DEFAULT_IMAGE_SIZE = (1024, 1024)  # seed 004: long edges of 1,024–1,568 px read tables and text
ACTIVATION_WIDTHS = 6  # residual, normed, q, k, v and attention output: hidden-wide tensors a patch
SERVED_MODEL_TYPES = frozenset({"idefics3", "smolvlm"})  # model types inhouse serve encodes
MAX_TILED_EDGE = 4096  # Idefics3/SmolVLM processors' cap on an image's longest edge


@dataclass(frozen=True, slots=True)
class VisionEncoder:
    """An image encoder and its projector into the language model."""

    family: str  # qwen2_vl, qwen2_5_vl, idefics3 (SmolVLM too) or llava
    layers: int
    hidden_size: int
    intermediate_size: int
    patch_size: int
    params: int  # the encoder and its projector
    output_width: int  # the language model's hidden size: one image token's embedding
    processor: dict[str, Any]  # the resize policy's numbers (family-specific keys)
    model_type: str = ""  # the config's own (smolvlm is of the idefics3 family)

    def image_grid(self, width: int, height: int) -> tuple[int, int]:
        """(patches the encoder runs over, tokens the image becomes in the prompt)."""
        if width < 1 or height < 1:
            raise PlanError(f"an image is at least 1 × 1 pixels, not {width} × {height}")
        if self.family in ("qwen2_vl", "qwen2_5_vl"):
            return self._qwen_grid(width, height)
        if self.family == "idefics3":
            return self._tiled_grid(width, height)
        side = self.processor["image_size"] // self.patch_size
        return side * side + 1, side * side + self.processor["cls_token"]

    def image_tokens(self, width: int, height: int) -> int:
        return self.image_grid(width, height)[1]

    def activation_bytes(self, width: int, height: int, dtype_bytes: int) -> int:
        """Peak memory while one image is encoded: a layer's hidden-wide tensors and its MLP's
        intermediate for every patch (attention by SDPA: no patches² scores), and the image's
        embeddings handed to the language model."""
        patches, tokens = self.image_grid(width, height)
        per_patch = ACTIVATION_WIDTHS * self.hidden_size + self.intermediate_size
        return (patches * per_patch + tokens * self.output_width) * dtype_bytes

    def _qwen_grid(self, width: int, height: int) -> tuple[int, int]:
        """Qwen2-VL's smart_resize: sides rounded to patch × merge, scaled into the pixel bounds."""
        merge = self.processor["merge_size"]
        factor = self.patch_size * merge
        low, high = self.processor["min_pixels"], self.processor["max_pixels"]
        h, w = round(height / factor) * factor, round(width / factor) * factor
        if h * w > high:
            beta = math.sqrt(height * width / high)
            h = max(factor, math.floor(height / beta / factor) * factor)
            w = max(factor, math.floor(width / beta / factor) * factor)
        elif h * w < low:
            beta = math.sqrt(low / (height * width))
            h, w = (
                math.ceil(height * beta / factor) * factor,
                math.ceil(width * beta / factor) * factor,
            )
        patches = (h // self.patch_size) * (w // self.patch_size)
        return patches, patches // (merge * merge)

    def _tiled_grid(self, width: int, height: int) -> tuple[int, int]:
        """Idefics3/SmolVLM: the longest edge scaled to the processor's size, the sides rounded up
        to tiles of the encoder's size; more than one tile adds the whole image as one more."""
        tile = self.processor["tile"]
        longest = self.processor["longest_edge"]
        if self.processor["split"]:
            if width >= height:
                width, height = longest, int(longest / (width / height))
                height += height % 2
            else:
                height, width = longest, int(longest * (width / height))
                width += width % 2
            scale = min(1.0, MAX_TILED_EDGE / max(width, height))
            width, height = max(1, int(width * scale)), max(1, int(height * scale))
            rows, columns = math.ceil(height / tile), math.ceil(width / tile)
            tiles = rows * columns + 1 if rows * columns > 1 else 1
        else:
            tiles = 1
        side = self.processor["image_size"] // self.patch_size
        return tiles * side * side, tiles * self.processor["image_seq_len"]


def _int(config: dict[str, Any], key: str, default: int, where: str) -> int:
    value = config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PlanError(
            f"the vision config's {key!r} must be a positive integer, not {value!r} ({where})"
        )
    return value


def _vit_layer(hidden: int, intermediate: int) -> int:
    """A pre-norm ViT layer: two LayerNorms, q/k/v/o and a two-linear MLP, all with biases."""
    return (
        4 * hidden
        + 4 * hidden * hidden
        + 4 * hidden
        + 2 * hidden * intermediate
        + intermediate
        + hidden
    )


def _qwen(
    config: dict[str, Any], vision: dict[str, Any], processor: dict[str, Any]
) -> VisionEncoder:
    family = config["model_type"]
    where = f"{family} vision_config"
    text_hidden = config.get("hidden_size") or (config.get("text_config") or {}).get("hidden_size")
    patch = _int(vision, "patch_size", 14, where)
    merge = _int(vision, "spatial_merge_size", 2, where)
    temporal = _int(vision, "temporal_patch_size", 2, where)
    channels = _int(vision, "in_chans", vision.get("in_channels", 3), where)
    layers = _int(vision, "depth", 32, where)
    if family == "qwen2_vl":
        hidden = _int(vision, "embed_dim", 1280, where)
        intermediate = hidden * _int(vision, "mlp_ratio", 4, where)
        out = _int(vision, "hidden_size", text_hidden or 3584, where)
        block = _vit_layer(hidden, intermediate)
        merger_norm = 2 * hidden
    else:  # Qwen2.5-VL: RMSNorms (a weight each) and a gated MLP with biases
        hidden = _int(vision, "hidden_size", 1280, where)
        intermediate = _int(vision, "intermediate_size", 3420, where)
        out = _int(vision, "out_hidden_size", text_hidden or 3584, where)
        block = (
            2 * hidden
            + 4 * hidden * hidden
            + 4 * hidden
            + 3 * hidden * intermediate
            + 2 * intermediate
            + hidden
        )
        merger_norm = hidden
    merged = hidden * merge * merge
    params = (
        channels * temporal * patch * patch * hidden  # patch embedding, no bias
        + layers * block
        + merger_norm
        + merged * merged
        + merged
        + merged * out
        + out
    )
    sizes = processor.get("size") or {}
    bounds = {
        "min_pixels": processor.get("min_pixels") or sizes.get("shortest_edge") or 56 * 56,
        "max_pixels": processor.get("max_pixels") or sizes.get("longest_edge") or 28 * 28 * 1280,
        "merge_size": processor.get("merge_size") or merge,
    }
    return VisionEncoder(family, layers, hidden, intermediate, patch, params, out, bounds)


def _idefics3(
    config: dict[str, Any], vision: dict[str, Any], processor: dict[str, Any]
) -> VisionEncoder:
    where = f"{config['model_type']} vision_config"
    text = config.get("text_config") or {}
    hidden = _int(vision, "hidden_size", 1152, where)
    intermediate = _int(vision, "intermediate_size", 3072, where)
    layers = _int(vision, "num_hidden_layers", 12, where)
    patch = _int(vision, "patch_size", 32 if config["model_type"] == "smolvlm" else 14, where)
    image = _int(vision, "image_size", 224, where)
    channels = _int(vision, "num_channels", 3, where)
    scale = _int(config, "scale_factor", 2, config["model_type"])
    out = _int(text, "hidden_size", 4096, f"{config['model_type']} text_config")
    side = image // patch
    params = (
        channels * patch * patch * hidden
        + hidden  # patch embedding
        + side * side * hidden  # positions
        + layers * _vit_layer(hidden, intermediate)
        + 2 * hidden  # post-layernorm
        + hidden * scale * scale * out  # connector, no bias
    )
    tile = (processor.get("max_image_size") or vision.get("max_image_size") or {}).get(
        "longest_edge", image
    )
    longest = (processor.get("size") or vision.get("size") or {}).get("longest_edge", 4 * tile)
    policy = {
        "image_size": image,
        "tile": tile,
        "longest_edge": longest,
        "split": bool(processor.get("do_image_splitting", True)),
        "image_seq_len": side * side // (scale * scale),
    }
    return VisionEncoder("idefics3", layers, hidden, intermediate, patch, params, out, policy)


def _llava(config: dict[str, Any], vision: dict[str, Any]) -> VisionEncoder:
    where = "llava vision_config"
    if vision.get("model_type", "clip_vision_model") != "clip_vision_model":
        raise PlanError(f"LLaVA with a {vision['model_type']} encoder is not planned (CLIP only)")
    hidden = _int(vision, "hidden_size", 768, where)
    intermediate = _int(vision, "intermediate_size", 3072, where)
    layers = _int(vision, "num_hidden_layers", 12, where)
    patch = _int(vision, "patch_size", 32, where)
    image = _int(vision, "image_size", 224, where)
    channels = _int(vision, "num_channels", 3, where)
    out = _int(config.get("text_config") or {}, "hidden_size", 4096, "llava text_config")
    side = image // patch
    projector_bias = bool(config.get("multimodal_projector_bias", True))
    params = (
        hidden
        + channels * patch * patch * hidden
        + (side * side + 1) * hidden  # CLS, patches, positions
        + 2 * hidden
        + layers * _vit_layer(hidden, intermediate)
        + 2 * hidden  # pre/post norms
        + hidden * out
        + out * out
        + (2 * out if projector_bias else 0)
    )
    full = config.get("vision_feature_select_strategy", "default") == "full"
    policy = {"image_size": image, "cls_token": 1 if full else 0}
    return VisionEncoder("llava", layers, hidden, intermediate, patch, params, out, policy)


def vision_encoder(
    config: dict[str, Any], processor: dict[str, Any] | None = None
) -> VisionEncoder | None:
    """The encoder a config's ``vision_config`` describes (None: a text-only model);
    ``processor`` is the folder's ``preprocessor_config.json`` (and ``processor_config.json``),
    its absent keys the processors' defaults."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return None
    processor = processor or {}
    family = config.get("model_type", "")
    if family in ("qwen2_vl", "qwen2_5_vl"):
        encoder = _qwen(config, vision, processor)
    elif family in ("idefics3", "smolvlm"):
        encoder = _idefics3(config, vision, processor)
    elif family == "llava":
        encoder = _llava(config, vision)
    else:
        raise PlanError(
            f"the vision encoder of a {family or 'model'} config is not planned "
            "(Qwen2-VL, Qwen2.5-VL, Idefics3/SmolVLM and LLaVA are)"
        )
    return replace(encoder, model_type=family)


def parse_image_size(text: str) -> tuple[int, int]:
    """``WIDTHxHEIGHT`` (or one number: a square) as --image-size takes it."""
    parts = text.lower().replace("×", "x").split("x")
    try:
        numbers = [int(part) for part in parts]
    except ValueError:
        numbers = []
    if len(numbers) not in (1, 2) or min(numbers) < 1:
        raise PlanError(f"--image-size takes WIDTHxHEIGHT in pixels (e.g. 1024x768), not {text!r}")
    return (numbers[0], numbers[-1])


def served_vision_folder(model: str | None) -> bool:
    """Whether ``model`` is an HF folder of a vision-language model inhouse serve encodes."""
    config = Path(model).expanduser() / "config.json" if model else None
    if config is None or not config.is_file():
        return False
    try:
        return json.loads(config.read_text()).get("model_type") in SERVED_MODEL_TYPES
    except (OSError, ValueError, AttributeError):
        return False


def parse_image_limit(text: str) -> int:
    """vLLM's ``--limit-mm-per-prompt`` value (``{"image": 4}``; ``image=4`` and a bare number
    are taken too): the images a prompt may hold."""
    try:
        value = json.loads(text)
    except ValueError:
        key, _, number = text.partition("=")
        value = {key.strip(): number.strip()} if number else None
    if isinstance(value, int):
        value = {"image": value}
    count = value.get("image") if isinstance(value, dict) and set(value) == {"image"} else None
    try:
        count = int(count)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        count = -1
    if count < 0:
        raise PlanError(
            f'--limit-mm-per-prompt takes images a prompt may hold, as {{"image": 4}}, not {text!r}'
        )
    return count


ENCODER_DTYPE_BYTES = 2  # the encoder runs in bf16/fp16 whatever the language model's weights


@dataclass(frozen=True, slots=True)
class VisionMemory:
    """What a plan sets aside for images, per GPU: the encoder's weights (split by tensor
    parallelism as vLLM splits them), the activations of encoding one prompt's images at once,
    and the tokens those images add to each sequence."""

    encoder: VisionEncoder | None
    images: int  # images a prompt may hold (--images-per-prompt, vLLM's --limit-mm-per-prompt)
    image_size: tuple[int, int]  # width, height before the processor resizes it
    tokens_per_image: int
    weight_bytes: int
    activation_bytes: int

    @property
    def total(self) -> int:
        return self.weight_bytes + self.activation_bytes

    @property
    def prompt_tokens(self) -> int:
        """Tokens a prompt's images add to its sequence."""
        return self.images * self.tokens_per_image


def vision_memory(
    encoder: VisionEncoder | None, images: int | None, image_size: tuple[int, int], tp: int
) -> VisionMemory:
    """The memory for ``images`` images a prompt (None: DEFAULT_IMAGES_PER_PROMPT for a
    vision model, else 0)."""
    if encoder is None:
        if images:
            raise PlanError(
                "--images-per-prompt needs a vision-language model: this one reads text only"
            )
        return VisionMemory(None, 0, image_size, 0, 0, 0)
    count = DEFAULT_IMAGES_PER_PROMPT if images is None else images
    if count < 0:
        raise PlanError(f"--images-per-prompt must be 0 or more, not {count}")
    width, height = image_size
    tokens = encoder.image_tokens(width, height)
    activations = count * encoder.activation_bytes(width, height, ENCODER_DTYPE_BYTES)
    weights = -(-encoder.params * ENCODER_DTYPE_BYTES // tp)
    return VisionMemory(encoder, count, image_size, tokens, weights, activations)
