"""xgrammar vs llguidance on this CPU with the bundled tokenizer: the numbers behind our choice.

For each JSON schema: grammar compile time, per-token mask time over a seeded random
walk (random logits, masked, argmax, with closing characters favoured so walks end),
and whether the walk ended in text that parses and validates against the schema.

    .venv/bin/python benchmarks/structured_libraries.py
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import jsonschema
import torch
from transformers import AutoTokenizer

from inhouse.manifests.bundled import default_chat_model

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    {
        "type": "object",
        "properties": {
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["age", "score"],
    },
    {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
        "required": ["color", "ok"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3}
        },
        "required": ["tags"],
    },
    {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "address": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                        "required": ["city", "zip"],
                    },
                },
                "required": ["id", "address"],
            }
        },
        "required": ["user"],
    },
    {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
            "required": ["x", "y"],
        },
        "maxItems": 4,
    },
    {
        "type": "object",
        "properties": {"value": {"anyOf": [{"type": "integer"}, {"type": "null"}]}},
        "required": ["value"],
    },
    {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
        "required": ["code"],
    },
]

Backend = Callable[[dict[str, Any]], tuple[Any, Callable[[torch.Tensor], None], Any]]


def xgrammar_backend(tokenizer: Any) -> Callable[[dict[str, Any]], Any]:
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    compiler = xgr.GrammarCompiler(info)
    bitmask = xgr.allocate_token_bitmask(1, len(tokenizer))

    def start(schema: dict[str, Any]) -> Any:
        compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
        matcher = xgr.GrammarMatcher(compiled)

        def mask(logits: torch.Tensor) -> None:
            matcher.fill_next_token_bitmask(bitmask)
            xgr.apply_token_bitmask_inplace(logits, bitmask)

        return mask, matcher.accept_token, matcher.is_terminated

    return start


def llguidance_backend(tokenizer: Any) -> Callable[[dict[str, Any]], Any]:
    import llguidance as llg
    import llguidance.hf
    import llguidance.torch as lt

    lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer))
    bitmask = lt.allocate_token_bitmask(1, len(tokenizer))

    def start(schema: dict[str, Any]) -> Any:
        grammar = llg.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False}
        )
        matcher = llg.LLMatcher(lltok, grammar)

        def mask(logits: torch.Tensor) -> None:
            lt.fill_next_token_bitmask(matcher, bitmask, 0)
            lt.apply_token_bitmask_inplace(logits, bitmask)

        return mask, matcher.consume_token, matcher.is_stopped

    return start


def walk(start: Any, schema: dict[str, Any], tokenizer: Any, bias: torch.Tensor, seed: int):
    t0 = time.perf_counter()
    mask, accept, done = start(schema)
    compile_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(seed)
    ids: list[int] = []
    mask_s: list[float] = []
    while not done() and len(ids) < 400:
        logits = torch.randn(1, len(tokenizer), generator=gen) + bias
        t0 = time.perf_counter()
        mask(logits)
        mask_s.append(time.perf_counter() - t0)
        token = int(logits.argmax())
        accept(token)
        ids.append(token)
    text = tokenizer.decode([i for i in ids if i != tokenizer.eos_token_id])
    try:
        jsonschema.validate(json.loads(text), schema)
        valid = done()
    except (ValueError, jsonschema.ValidationError):
        valid = False
    return compile_s, mask_s, valid


def main() -> None:
    path = default_chat_model()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    closers = [i for t, i in tokenizer.get_vocab().items() if any(c in t for c in '"}]')]
    bias = torch.zeros(len(tokenizer))
    bias[closers] = 2.5
    bias[tokenizer.eos_token_id] = 8.0
    for name, factory in [("xgrammar", xgrammar_backend), ("llguidance", llguidance_backend)]:
        t0 = time.perf_counter()
        start = factory(tokenizer)
        setup_s = time.perf_counter() - t0
        compiles, masks, valid = [], [], 0
        for seed in range(3):
            for schema in SCHEMAS:
                c, m, ok = walk(start, schema, tokenizer, bias, seed)
                compiles.append(c)
                masks.extend(m)
                valid += ok
        masks_us = sorted(x * 1e6 for x in masks)
        print(
            f"{name:11s} tokenizer setup {setup_s * 1e3:7.0f} ms | compile median "
            f"{statistics.median(compiles) * 1e3:6.1f} ms max {max(compiles) * 1e3:6.1f} ms | "
            f"mask/token median {statistics.median(masks_us):6.0f} us "
            f"p99 {masks_us[int(0.99 * len(masks_us))]:6.0f} us | "
            f"valid {valid}/{len(compiles)}"
        )


if __name__ == "__main__":
    main()
