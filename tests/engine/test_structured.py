"""The xgrammar guide: every walk the mask allows ends in JSON that validates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch
from transformers import AutoTokenizer

from inhouse.engine.structured import GrammarCompiler, GrammarError, bounded
from inhouse.manifests.bundled import default_chat_model

SCHEMAS = json.loads((Path(__file__).parents[1] / "data" / "json_schemas.json").read_text())
MAX_STEPS = 300


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    path = default_chat_model()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def compiler(tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, len(tokenizer), {tokenizer.eos_token_id})


@pytest.fixture(scope="module")
def closing_bias(tokenizer: Any) -> torch.Tensor:
    """Favour quotes, brackets and the stop token so random walks end."""
    bias = torch.zeros(len(tokenizer))
    closers = [i for t, i in tokenizer.get_vocab().items() if any(c in t for c in '"}]')]
    bias[closers] = 2.5
    bias[tokenizer.eos_token_id] = 8.0
    return bias


def random_walk(guide: Any, bias: torch.Tensor, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    ids: list[int] = []
    while not guide.is_terminated() and len(ids) < MAX_STEPS:
        logits = torch.randn(bias.shape[0], generator=gen) + bias
        guide.mask_logits(logits)
        token = int(logits.argmax())
        guide.accept(token)
        ids.append(token)
    return ids


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_random_walks_under_the_mask_end_in_valid_json(
    index: int, tokenizer: Any, compiler: GrammarCompiler, closing_bias: torch.Tensor
) -> None:
    schema = SCHEMAS[index]
    guide = compiler.json_schema(schema).factory()()
    ids = random_walk(guide, closing_bias, seed=index)
    assert guide.is_terminated(), "the walk did not end"
    assert ids[-1] == tokenizer.eos_token_id
    jsonschema.validate(json.loads(tokenizer.decode(ids[:-1])), schema)


def test_json_object_mode_gives_an_object(
    tokenizer: Any, compiler: GrammarCompiler, closing_bias: torch.Tensor
) -> None:
    guide = compiler.json_object().factory()()
    ids = random_walk(guide, closing_bias, seed=0)
    assert isinstance(json.loads(tokenizer.decode(ids[:-1])), dict)


def test_stop_token_is_masked_until_the_json_is_complete(
    tokenizer: Any, compiler: GrammarCompiler
) -> None:
    guide = compiler.json_schema(SCHEMAS[0]).factory()()
    logits = torch.zeros(len(tokenizer))
    guide.mask_logits(logits)
    assert logits[tokenizer.eos_token_id] == float("-inf")
    assert torch.isfinite(logits).sum() >= 1
    allowed = int(torch.isfinite(logits).nonzero()[0])
    assert tokenizer.decode([allowed]).startswith("{")


def test_guides_from_one_factory_are_independent(tokenizer: Any, compiler: GrammarCompiler) -> None:
    factory = compiler.json_schema(SCHEMAS[0]).factory()
    first, second = factory(), factory()
    first.accept(tokenizer.encode("{", add_special_tokens=False)[0])
    logits = torch.zeros(len(tokenizer))
    second.mask_logits(logits)
    assert torch.isfinite(logits[tokenizer.encode("{", add_special_tokens=False)[0]])


def test_a_forbidden_token_is_refused(tokenizer: Any, compiler: GrammarCompiler) -> None:
    guide = compiler.json_schema(SCHEMAS[0]).factory()()
    with pytest.raises(ValueError, match="not allowed"):
        guide.accept(tokenizer.encode("hello", add_special_tokens=False)[0])


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"type": "nonsense"}, 'Unsupported type "nonsense"'),
        ({"type": "string", "pattern": "("}, "Regex parsing error at position"),
        ({"type": "string", "minLength": 9, "maxLength": 2}, "minLength 9 is greater than"),
    ],
)
def test_schemas_that_cannot_be_compiled_raise_grammar_error_saying_why(
    compiler: GrammarCompiler, schema: dict, reason: str
) -> None:
    with pytest.raises(GrammarError) as refused:
        compiler.json_schema(schema)
    message = str(refused.value)  # what the client reads: no time stamp or C++ source line
    assert message.startswith(f"The JSON schema cannot be enforced: {reason}"), message
    assert "[" not in message and ".cc" not in message and "/project" not in message


def test_bounded_closes_open_strings_and_arrays_only() -> None:
    schema = {
        "type": "object",
        "properties": {
            "free": {"type": "string"},
            "long": {"type": "string", "minLength": 500},
            "code": {"type": "string", "pattern": "^[A-Z]+$"},
            "tags": {"type": "array", "items": {"type": ["string", "null"]}},
            "fixed": {"const": {"type": "string"}},
        },
    }
    out = bounded(schema, max_string_length=10, max_items=4)
    props = out["properties"]
    assert props["free"]["maxLength"] == 10
    assert props["long"]["maxLength"] == 500
    assert "maxLength" not in props["code"]
    assert props["tags"]["maxItems"] == 4
    assert props["tags"]["items"]["maxLength"] == 10
    assert props["fixed"] == {"const": {"type": "string"}}
    assert "maxLength" not in schema["properties"]["free"]  # the input is not modified
