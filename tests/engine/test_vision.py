"""Images in our engine, on tiny random Idefics3 and SmolVLM checkpoints that transformers
saves: the encoder's rows equal transformers' own (padded tiles too), 10 image+text prompts
give HF's greedy tokens with the prompt ids HF's processor writes, and the prefix cache keys
blocks by image: a different image of the same size shares nothing from its first image
block on, the same image again is a hit. (SmolVLM's processor class needs torchvision's video
processor, absent here: its prompt text comes from its module's own placeholder function.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_helpers import add, greedy, run_to_end, tiny_engine

from hf_reference import hf_greedy
from inhouse.engine.errors import EngineInputError
from inhouse.engine.images import PromptImage, place_images
from inhouse.engine.models.loader import LoadedModel, load_model
from tiny_vision import noise_image, save_tiny_idefics3, save_tiny_smolvlm

NEW_TOKENS = 10
# (image sizes, text): 1-3 images each, wide, tall, tiny and square, split and not
PROMPTS = [
    ([(40, 60)], "What is in the picture?"),
    ([(64, 64)], "Describe it."),
    ([(90, 20), (20, 90)], "Compare the two."),
    ([(8, 8)], "Is it dark?"),
    ([(33, 65), (70, 10), (50, 50)], "Three pictures: which is widest?"),
    ([(100, 31)], "Count the colours."),
    ([(31, 100), (64, 32)], "Which one is taller?"),
    ([(17, 23)], "Say one word."),
    ([(64, 128)], "Read the text."),
    ([(45, 45), (45, 45)], "Are they the same?"),
]


SAVERS = {"idefics3": save_tiny_idefics3, "smolvlm": save_tiny_smolvlm}


@pytest.fixture(scope="module", params=sorted(SAVERS))
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return SAVERS[request.param](tmp_path_factory.mktemp(f"tiny-{request.param}"), seed=5)


@pytest.fixture(scope="module")
def loaded(folder: Path) -> LoadedModel:
    return load_model(folder, dtype="float32")


class Reference:
    """Transformers' model and the inputs its processor gives."""

    def __init__(self, folder: Path) -> None:
        from transformers import AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

        model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
        self.model = model.eval()
        self.smolvlm = model.config.model_type == "smolvlm"
        if self.smolvlm:
            from transformers import AutoImageProcessor

            self.images = AutoImageProcessor.from_pretrained(folder)
            self.tokenizer = AutoTokenizer.from_pretrained(folder)
        else:
            self.processor = AutoProcessor.from_pretrained(folder)
            self.tokenizer = self.processor.tokenizer

    def inputs(self, text: str, images: list) -> dict[str, torch.Tensor]:
        if not self.smolvlm:
            return self.processor(text=[text], images=[images], add_special_tokens=False,
                                  return_tensors="pt")  # fmt: skip
        from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

        out = self.images(images=[images], return_row_col_info=True, return_tensors="pt")
        pieces = text.split("<image>")
        seq_len = self.model.model.image_seq_len
        for k, (rows, cols) in enumerate(zip(out["rows"][0], out["cols"][0], strict=True)):
            placeholder = get_image_prompt_string(rows, cols, seq_len,
                "<fake_token_around_image>", "<image>", "<global-img>")  # fmt: skip
            pieces[k + 1] = placeholder + pieces[k + 1]
        ids = self.tokenizer("".join(pieces), add_special_tokens=False, return_tensors="pt")
        return {"input_ids": ids["input_ids"], "pixel_values": out["pixel_values"],
                "pixel_attention_mask": out["pixel_attention_mask"]}  # fmt: skip


@pytest.fixture(scope="module")
def hf(folder: Path) -> Reference:
    return Reference(folder)


def chat_text(hf: Reference, count: int, text: str) -> str:
    content = [{"type": "image"}] * count + [{"type": "text", "text": text}]
    return hf.tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )


def our_prompt(loaded: LoadedModel, text: str, images: list) -> tuple[list[int], list]:
    """The prompt as the server builds it: the template's image tokens replaced by the
    image side's placeholders, tokenized whole, the images placed."""
    side = loaded.images
    assert side is not None
    joined, placed = side.with_placeholders(text, images)
    ids = loaded.tokenizer(joined, add_special_tokens=False)["input_ids"]
    place_images(ids, placed, side.image_token_id)
    return ids, placed


def test_the_encoder_rows_equal_transformers_for_whole_and_padded_tiles(loaded, hf) -> None:
    model = hf.model
    side = loaded.images
    assert side is not None
    for seed, size in enumerate([(40, 60), (100, 31), (8, 8)]):
        image, _ = side.prepare(noise_image(seed, size))
        pixels, mask = image.pixels, image.pixel_mask.clone()
        mask[0, :, 20:] = False  # the first tile padded past column 20: its last patches masked
        pixels[0, :, :, 20:] = 0.0
        for tile_mask in (image.pixel_mask, mask):
            with torch.no_grad():
                theirs = model.model.get_image_features(pixels[None], tile_mask[None].long())
            ours = side.tower(pixels, tile_mask)
            torch.testing.assert_close(ours, theirs.pooler_output[0], rtol=1e-5, atol=1e-5)


def test_greedy_tokens_equal_hf_for_ten_image_and_text_prompts(loaded, hf) -> None:
    engine = tiny_engine(loaded, max_model_len=512, block_size=4)
    differ = 0
    for i, (sizes, question) in enumerate(PROMPTS):
        images = [noise_image(100 * i + k, size) for k, size in enumerate(sizes)]
        text = chat_text(hf, len(images), question)
        reference = hf.inputs(text, images)
        ids, placed = our_prompt(loaded, text, images)
        assert ids == reference["input_ids"][0].tolist()
        add(engine, f"r{i}", ids, greedy(NEW_TOKENS), images=tuple(placed))
        ours = run_to_end(engine)[f"r{i}"].choices[0].token_ids
        pixels = {k: reference[k] for k in ("pixel_values", "pixel_attention_mask")}
        assert ours == hf_greedy(hf.model, ids, NEW_TOKENS, **pixels), f"prompt {i}"
        other = [noise_image(999 + k, size) for k, size in enumerate(sizes)]
        ids_other, placed_other = our_prompt(loaded, text, other)
        add(engine, f"o{i}", ids_other, greedy(NEW_TOKENS), images=tuple(placed_other))
        differ += run_to_end(engine)[f"o{i}"].choices[0].token_ids != ours
    assert differ >= 8, "the images hardly change the answers: are they read at all?"


def test_a_prompt_prefilled_in_chunks_that_cut_its_images_gives_hfs_tokens(loaded, hf) -> None:
    """Steps of 7 tokens: chunk edges fall inside tiles and between them."""
    engine = tiny_engine(loaded, max_model_len=512, block_size=4, max_num_batched_tokens=7)
    sizes, question = PROMPTS[4]
    images = [noise_image(400 + k, size) for k, size in enumerate(sizes)]
    text = chat_text(hf, len(images), question)
    reference = hf.inputs(text, images)
    ids, placed = our_prompt(loaded, text, images)
    add(engine, "chunked", ids, greedy(NEW_TOKENS), images=tuple(placed))
    ours = run_to_end(engine)["chunked"].choices[0].token_ids
    pixels = {k: reference[k] for k in ("pixel_values", "pixel_attention_mask")}
    assert ours == hf_greedy(hf.model, ids, NEW_TOKENS, **pixels)


def cached_tokens(engine, request_id: str, ids: list[int], placed: list[PromptImage]) -> int:
    add(engine, request_id, ids, greedy(2), images=tuple(placed))
    return run_to_end(engine)[request_id].num_cached_tokens


def test_the_prefix_cache_keys_blocks_by_image(loaded, hf) -> None:
    engine = tiny_engine(loaded, max_model_len=512, block_size=4)
    text = chat_text(hf, 1, "What is in the picture?")
    first = our_prompt(loaded, text, [noise_image(1, (40, 60))])
    again = our_prompt(loaded, text, [noise_image(1, (40, 60))])
    other = our_prompt(loaded, text, [noise_image(2, (40, 60))])
    assert first[0] == other[0]  # same size: the very same token ids
    assert cached_tokens(engine, "first", *first) == 0
    image_start = first[1][0].positions[0]
    assert cached_tokens(engine, "other", *other) == image_start // 4 * 4
    whole = (len(first[0]) - 1) // 4 * 4  # every full block but one the last token needs
    encoded = loaded.images.encoded
    assert cached_tokens(engine, "again", *again) == whole
    assert loaded.images.encoded == encoded  # its last rows from the encoder's recent images


def test_a_prompt_with_image_tokens_its_images_do_not_fill_is_refused(loaded) -> None:
    """One image token more than the image's rows (text that wrote the token itself), or
    image tokens with no image at all: the engine refuses the request, whoever built it."""
    side = loaded.images
    image, _ = side.prepare(noise_image(0, (9, 9)))
    engine = tiny_engine(loaded, max_model_len=512, block_size=4)
    one_more = [5, 6, *[side.image_token_id] * (image.num_tokens + 1), 7]
    place_images(one_more, [image], side.image_token_id)
    for request_id, ids, images in (("more", one_more, (image,)), ("none", one_more, ())):
        with pytest.raises(EngineInputError, match="text must not contain the token"):
            add(engine, request_id, ids, greedy(2), images=images)
    assert not engine.has_unfinished()


def test_a_config_that_leaves_keys_to_their_defaults_builds_the_encoder() -> None:
    """SmolVLM2-500M's published config.json names only some of its vision keys (no layer
    count, no MLP width): transformers' config class fills them, and so must we."""
    from transformers import SmolVLMConfig
    from transformers.models.smolvlm.modeling_smolvlm import SmolVLMModel

    from inhouse.engine.models.idefics3_vision import Idefics3Vision

    published = {
        "model_type": "smolvlm", "scale_factor": 4, "image_token_id": 49190,
        "vision_config": {"hidden_size": 768, "image_size": 512, "num_attention_heads": 12,
                          "patch_size": 16, "model_type": "smolvlm_vision"},
        "text_config": {"hidden_size": 960, "model_type": "llama"},
    }  # fmt: skip
    config = SmolVLMConfig(**published)
    with torch.device("meta"):
        ours = Idefics3Vision(config.vision_config, config.scale_factor, 960)
        theirs = SmolVLMModel(config)
    image_side = [theirs.vision_model, theirs.connector]
    expected = sum(p.numel() for module in image_side for p in module.parameters())
    assert sum(p.numel() for p in ours.parameters()) == expected == 98_229_504  # as the plan
