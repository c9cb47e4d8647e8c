"""ModelSpec from published config.json files; parameter counts against published totals."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from published_configs import (
    DEEPSEEK_V3,
    GEMMA_2_9B,
    LLAMA_3_1_8B,
    MIXTRAL_8X7B,
    QWEN2_5_7B,
    QWEN3_30B_A3B,
)

from inhouse.plan.catalogue import catalogue_names, catalogue_spec
from inhouse.plan.errors import PlanError
from inhouse.plan.source import load_model
from inhouse.plan.spec import checkpoint_format, spec_from_hf_config


@pytest.mark.parametrize(
    ("config", "name"),
    [
        (LLAMA_3_1_8B, "Llama-3.1-8B"),
        (QWEN2_5_7B, "Qwen2.5-7B"),
        (QWEN3_30B_A3B, "Qwen3-30B-A3B"),
        (MIXTRAL_8X7B, "Mixtral-8x7B-v0.1"),
        (GEMMA_2_9B, "Gemma-2-9B"),
        (DEEPSEEK_V3, "DeepSeek-V3"),
    ],
)
def test_published_config_reads_as_the_catalogue_entry(config: dict, name: str) -> None:
    spec = spec_from_hf_config(config, name=name)
    assert spec == catalogue_spec(name)


# Published totals: model cards and technical reports.
PUBLISHED_PARAMS = {
    "SmolLM2-135M": (134.5e6, None),
    "Llama-3.1-8B": (8.03e9, None),
    "Llama-3.1-70B": (70.6e9, None),
    "Llama-2-70B": (69.0e9, None),
    "Mistral-7B-v0.1": (7.24e9, None),
    "Mixtral-8x7B-v0.1": (46.7e9, 12.9e9),
    "Qwen2.5-7B": (7.61e9, None),
    "Qwen2.5-72B": (72.7e9, None),
    "Qwen3-8B": (8.2e9, None),
    "Qwen3-30B-A3B": (30.5e9, 3.3e9),
    "Gemma-2-9B": (9.24e9, None),
    "DeepSeek-V3": (671e9, 37e9),
}


def test_catalogue_covers_the_issue_list() -> None:
    assert set(catalogue_names()) == set(PUBLISHED_PARAMS)


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_parameter_counts_match_published_totals(name: str) -> None:
    spec = catalogue_spec(name)
    total, active = PUBLISHED_PARAMS[name]
    assert spec.total_params == pytest.approx(total, rel=0.01)
    assert spec.active_params == pytest.approx(active or total, rel=0.02)


def test_moe_weights_follow_total_and_compute_follows_active() -> None:
    spec = catalogue_spec("Mixtral-8x7B")
    counts = spec.param_counts()
    idle = counts.routed_experts * 6 // 8  # 6 of 8 experts idle per token
    assert spec.active_params == spec.total_params - idle


def test_tied_embeddings_are_counted_once() -> None:
    untied = dataclasses.replace(catalogue_spec("SmolLM2-135M"), tie_word_embeddings=False)
    tied = catalogue_spec("SmolLM2-135M")
    assert untied.total_params - tied.total_params == 49152 * 576


def test_absent_tie_word_embeddings_means_transformers_default_true() -> None:
    assert spec_from_hf_config(GEMMA_2_9B).tie_word_embeddings is True


def test_qwen_sliding_window_is_ignored_when_use_sliding_window_is_false() -> None:
    assert spec_from_hf_config(QWEN2_5_7B).sliding_layers == ()


def test_layer_types_name_the_sliding_layers() -> None:
    config = {**GEMMA_2_9B, "layer_types": ["full_attention", "sliding_attention"] * 21}
    assert spec_from_hf_config(config).sliding_layers == tuple(range(1, 42, 2))


def test_checkpoint_format_comes_from_quantization_config_or_dtype() -> None:
    assert checkpoint_format(DEEPSEEK_V3) == "fp8"
    awq = {**LLAMA_3_1_8B, "quantization_config": {"quant_method": "awq", "bits": 4}}
    assert checkpoint_format(awq) == "awq"
    assert checkpoint_format({**LLAMA_3_1_8B, "torch_dtype": "float16"}) == "fp16"
    assert checkpoint_format(LLAMA_3_1_8B) == "bf16"


def test_load_model_reads_a_file_and_a_folder(tmp_path: Path) -> None:
    folder = tmp_path / "Qwen3-30B-A3B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN3_30B_A3B))
    by_folder = load_model(str(folder))
    by_file = load_model(str(folder / "config.json"))
    assert by_folder.spec == by_file.spec
    assert by_folder.spec.name == "Qwen3-30B-A3B"
    assert by_folder.spec.num_experts == 128


def test_catalogue_names_are_case_insensitive() -> None:
    assert load_model("LLAMA-3.1-8b").spec.name == "Llama-3.1-8B"
    assert load_model("smollm2").spec.name == "SmolLM2-135M"


@pytest.mark.parametrize("missing", ["num_hidden_layers", "hidden_size", "vocab_size"])
def test_config_lacking_a_field_names_it(missing: str) -> None:
    config = {k: v for k, v in LLAMA_3_1_8B.items() if k != missing}
    with pytest.raises(PlanError, match=f"lacks field '{missing}'"):
        spec_from_hf_config(config, name="llama")


def test_malformed_json_is_reported_with_its_position(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 4096,,}')
    with pytest.raises(PlanError, match=r"is not valid JSON \(line 1, column 22"):
        load_model(str(path))


def test_unknown_name_lists_the_catalogue() -> None:
    with pytest.raises(PlanError, match=r"not in the catalogue .*Llama-3\.1-8B"):
        load_model("gpt-5")


def test_missing_file_is_reported() -> None:
    with pytest.raises(PlanError, match=r"no such file: /nowhere/config\.json"):
        load_model("/nowhere/config.json")
