"""A vision-language model's plan: the encoder's parameters against transformers' own modules,
the tokens an image becomes against transformers' own image processors, and the memory
table, concurrency and flags that follow."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from PIL import Image
from published_configs import (
    QWEN2_VL_2B_INSTRUCT,
    QWEN2_VL_2B_INSTRUCT_PROCESSOR,
    SMOLVLM2_500M,
    SMOLVLM2_500M_PROCESSOR,
)
from test_plan_cli import assert_one_sentence_error, run
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

from inhouse.plan.errors import PlanError
from inhouse.plan.planner import PlanInputs, make_plan
from inhouse.plan.source import load_model
from inhouse.plan.vision import parse_image_limit, vision_encoder

HF_CLASSES = {
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "idefics3": "Idefics3ForConditionalGeneration",
    "smolvlm": "SmolVLMForConditionalGeneration",
    "llava": "LlavaForConditionalGeneration",
}
LANGUAGE_PARTS = {"language_model", "text_model", "lm_head"}
SIZES = [(1024, 1024), (640, 480), (333, 777), (4000, 3000), (1920, 1080), (512, 512), (10, 10)]


def hf_encoder_params(config: dict[str, Any]) -> int:
    """Parameters outside the language model, as transformers builds the model (meta tensors)."""
    hf_config = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = getattr(transformers, HF_CLASSES[config["model_type"]])(hf_config)
    return sum(
        p.numel()
        for name, p in model.named_parameters()
        if name.removeprefix("model.").split(".")[0] not in LANGUAGE_PARTS
    )


def folder(tmp_path: Path, config: dict[str, Any], processor: dict[str, Any]) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(processor))
    return tmp_path


@pytest.mark.parametrize(
    "config", [QWEN2_VL_2B_INSTRUCT, SMOLVLM2_500M], ids=["qwen2-vl-2b", "smolvlm2-500m"]
)
def test_real_configs_encoder_params_match_transformers(config: dict[str, Any]) -> None:
    ours = vision_encoder(config).params
    theirs = hf_encoder_params(config)
    assert abs(ours - theirs) <= 0.01 * theirs, (ours, theirs)
    assert ours == theirs  # counted from the same shapes: exact


@pytest.mark.parametrize("model_type", sorted(HF_CLASSES))
def test_each_family_default_config_matches_transformers(model_type: str) -> None:
    config = transformers.AutoConfig.for_model(model_type).to_dict()
    assert vision_encoder(config).params == hf_encoder_params(config)


def test_qwen2_vl_image_tokens_match_its_processor() -> None:
    ours = vision_encoder(QWEN2_VL_2B_INSTRUCT, QWEN2_VL_2B_INSTRUCT_PROCESSOR)
    default_bounds = vision_encoder(QWEN2_VL_2B_INSTRUCT)
    for processor, encoder in (
        (Qwen2VLImageProcessorPil(min_pixels=3136, max_pixels=12845056), ours),
        (Qwen2VLImageProcessorPil(), default_bounds),
    ):
        for width, height in SIZES:
            image = Image.fromarray(np.zeros((height, width, 3), dtype=np.uint8))
            grid = processor(images=[image], return_tensors="np")["image_grid_thw"][0]
            assert encoder.image_tokens(width, height) == int(np.prod(grid)) // 4, (width, height)


def test_smolvlm_image_tokens_match_its_processor() -> None:
    encoder = vision_encoder(SMOLVLM2_500M, SMOLVLM2_500M_PROCESSOR)
    processor = SmolVLMImageProcessorPil(
        do_image_splitting=True, max_image_size={"longest_edge": 512}, size={"longest_edge": 2048}
    )
    for width, height in [*SIZES, (513, 200), (200, 513)]:
        tiles, _, _ = processor.get_number_of_image_patches(height, width, {})
        assert encoder.image_tokens(width, height) == max(tiles, 1) * 64, (width, height)


def test_plan_sets_aside_the_encoder_and_counts_image_tokens(tmp_path: Path) -> None:
    model = load_model(folder(tmp_path, QWEN2_VL_2B_INSTRUCT, QWEN2_VL_2B_INSTRUCT_PROCESSOR))
    text = make_plan(model, PlanInputs(gpu="RTX 4090", avg_context=2000, images_per_prompt=0))
    four = make_plan(model, PlanInputs(gpu="RTX 4090", avg_context=2000, images_per_prompt=4))
    assert four.vision.tokens_per_image == 1369  # 1024×1024 → 37 × 37 merged patches
    assert four.avg_context == 2000 + 4 * 1369
    assert four.vision.weight_bytes == 665_271_296 * 2
    assert text.vision.weight_bytes == four.vision.weight_bytes  # resident with no image too
    assert text.vision.activation_bytes == 0
    assert text.kv_budget - four.kv_budget == four.vision.activation_bytes
    assert four.vision.activation_bytes == 4 * text.vision.encoder.activation_bytes(1024, 1024, 2)
    assert four.max_concurrent < text.max_concurrent


def test_cli_prints_tokens_rows_json_and_vllm_limit(tmp_path: Path) -> None:
    path = str(folder(tmp_path, SMOLVLM2_500M, SMOLVLM2_500M_PROCESSOR))
    shown = run(path, "--images-per-prompt", "4", "--image-size", "640x480")
    assert shown.exit_code == 0, shown.output
    assert "832 tokens per 640×480 image" in shown.stdout
    assert "vision encoder" in shown.stdout and "image activations" in shown.stdout
    numbers = json.loads(run(path, "--images-per-prompt", "4", "--json").stdout)
    assert numbers["vision"]["encoder_params"] == 98_229_504
    assert numbers["vision"]["tokens_per_image"] == 1088  # 1024×1024: 4 × 4 tiles + the whole
    emitted = run(path, "--images-per-prompt", "4", "--emit", "vllm").stdout
    assert "--limit-mm-per-prompt '{\"image\": 4}'" in emitted
    emitted = run(path, "--images-per-prompt", "3", "--emit", "inhouse").stdout
    assert "--limit-mm-per-prompt '{\"image\": 3}'" in emitted  # a family we encode
    (tmp_path / "qwen").mkdir()
    path = str(folder(tmp_path / "qwen", QWEN2_VL_2B_INSTRUCT, QWEN2_VL_2B_INSTRUCT_PROCESSOR))
    assert "not qwen2_vl: serve this one with vLLM" in run(path, "--emit", "inhouse").stdout


def test_images_on_a_text_model_and_bad_sizes_are_one_sentence_errors() -> None:
    assert_one_sentence_error(run("--images-per-prompt", "2"), 2, "needs a vision-language model")
    assert_one_sentence_error(run("--image-size", "big"), 2, "--image-size takes WIDTHxHEIGHT")


def test_the_image_limit_is_read_as_vllm_spells_it() -> None:
    for text in ('{"image": 4}', "image=4", "4"):
        assert parse_image_limit(text) == 4
    assert parse_image_limit('{"image": 0}') == 0  # vLLM's way to serve a VLM text-only
    for bad in ('{"video": 2}', '{"image": -1}', '{"image": "x"}', "images", "[4]"):
        with pytest.raises(PlanError, match="--limit-mm-per-prompt"):
            parse_image_limit(bad)
