"""A tiny random Idefics3 checkpoint for tests (SmolVLM's family): a SigLIP-style encoder over
32-pixel tiles of 8-pixel patches, pixel-shuffled into 4 tokens a tile, and a tiny Llama,
saved with `save_pretrained` beside its processor (Idefics3's image processor: the longest
edge scaled to 64, cut into 32-pixel tiles plus the whole image; the tiny tokenizer with the
image tokens; a chat template that places each image part), so vLLM and transformers read
it as a downloaded model. vLLM's CPU build loads this family without torchvision."""

from __future__ import annotations

from pathlib import Path

from tiny_models import TINY_COMMON, TINY_VOCAB, _randomize, _tiny_tokenizer

IMAGE_TOKENS = ("<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>")
TILE, PATCH, SCALE = 32, 8, 2
TOKENS_PER_TILE = (TILE // PATCH) ** 2 // SCALE**2
IMAGE_SIZES = {  # the long edge scaled to two tiles, then cut into tiles and the whole
    "size": {"longest_edge": 2 * TILE},
    "max_image_size": {"longest_edge": TILE},
    "do_image_splitting": True,
}
VISION_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for part in m['content'] %}"
    "{% if part['type'] in ('image', 'image_url') %}<image>{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_processor():
    """The checkpoint's processor (tokenizer with the image tokens, image processor)."""
    from transformers import Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import (
        Idefics3ImageProcessorPil,
    )

    tokenizer = _tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": list(IMAGE_TOKENS)})
    tokenizer.chat_template = VISION_TEMPLATE
    images = Idefics3ImageProcessorPil(**IMAGE_SIZES)
    return Idefics3Processor(
        image_processor=images, tokenizer=tokenizer, image_seq_len=TOKENS_PER_TILE,
        chat_template=VISION_TEMPLATE,
    )  # fmt: skip


def save_tiny_idefics3(folder: Path, seed: int = 0) -> Path:
    """The checkpoint in `folder` (random weights from `seed`)."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3VisionConfig

    processor = tiny_processor()
    _save(folder, seed, processor.tokenizer, Idefics3Config, Idefics3VisionConfig,
          Idefics3ForConditionalGeneration)  # fmt: skip
    processor.save_pretrained(folder)
    return folder


def save_tiny_smolvlm(folder: Path, seed: int = 0) -> Path:
    """SmolVLM's own model type (the same design): the checkpoint, its tokenizer and its image
    processor (SmolVLM's processor itself needs torchvision's video processor)."""
    from transformers import SmolVLMConfig, SmolVLMForConditionalGeneration
    from transformers.models.smolvlm.configuration_smolvlm import SmolVLMVisionConfig
    from transformers.models.smolvlm.image_processing_pil_smolvlm import (
        SmolVLMImageProcessorPil,
    )

    tokenizer = tiny_processor().tokenizer
    _save(folder, seed, tokenizer, SmolVLMConfig, SmolVLMVisionConfig,
          SmolVLMForConditionalGeneration)  # fmt: skip
    tokenizer.save_pretrained(folder)
    SmolVLMImageProcessorPil(**IMAGE_SIZES).save_pretrained(folder)
    return folder


def _save(folder: Path, seed: int, tokenizer, config_class, vision_class, model_class) -> None:
    import torch
    from transformers import LlamaConfig

    # head_dim 32: vLLM's CPU attention takes no smaller
    text = LlamaConfig(**{**TINY_COMMON, "vocab_size": TINY_VOCAB + len(IMAGE_TOKENS),
                          "num_attention_heads": 2, "num_key_value_heads": 1})  # fmt: skip
    vision = vision_class(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        image_size=TILE, patch_size=PATCH,
    )  # fmt: skip
    config = config_class(
        text_config=text.to_dict(), vision_config=vision.to_dict(), scale_factor=SCALE,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"), tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = model_class(config).to(torch.float32)
    _randomize(model, seed)
    model.save_pretrained(folder)


def noise_image(seed: int, size: tuple[int, int]):
    """An RGB PIL image of ``size`` (width, height), random pixels from ``seed``."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def data_uri(image) -> str:
    """The image as a PNG data URI, as a client sends it."""
    import base64
    import io

    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
