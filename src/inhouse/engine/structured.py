"""Grammar-constrained decoding with xgrammar: the ``Guide`` the sampler consults every token.

A :class:`GrammarCompiler` is built once per tokenizer; it turns a JSON schema (or "any
JSON object") into a compiled grammar, and :meth:`CompiledGuide.factory` hands the
engine a ``guide_factory`` that gives every sequence its own matcher. The grammar
allows no free whitespace, so a tiny model cannot pad forever, and it ends the
generation by allowing the end-of-sequence token only once the JSON is complete.

Why xgrammar and not llguidance: the numbers in ``docs/serve.md``, "Tools and structured
output" (the script that measured them is retired, ``docs/archive/benchmarks-retired-scripts.md``).

xgrammar is imported, and the tokenizer's vocabulary read into it (~0.5 s together on a
2-core CPU), by the first schema compiled, not at server start: most servers never get
a structured request, and those that do pay it once.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import xgrammar as xgr

_KEY = {"maxLength": 64}
_SCALAR = {"type": ["string", "number", "boolean", "null"]}
# ``json_object`` mode: an object up to two levels deep, at most 16 keys per object.
ANY_JSON_OBJECT: dict[str, Any] = {
    "type": "object",
    "maxProperties": 16,
    "propertyNames": _KEY,
    "additionalProperties": {
        "anyOf": [
            _SCALAR,
            {"type": "array", "items": _SCALAR},
            {
                "type": "object",
                "maxProperties": 16,
                "propertyNames": _KEY,
                "additionalProperties": _SCALAR,
            },
        ]
    },
}
# Bounds added where a schema leaves strings or arrays open, so a small model that
# repeats itself still has to close the JSON; anything within them validates.
DEFAULT_MAX_STRING_LENGTH = 256
DEFAULT_MAX_ITEMS = 64
# xgrammar keeps every compiled grammar (token masks per grammar state) unless bounded:
# 300 distinct six-key schemas held 106 MB (~0.35 MB each), so a fuzzer's thousands held
# most of a GB. Past this, the least recently used are evicted (and compiled again).
GRAMMAR_CACHE_BYTES = 32 * 2**20
_LITERAL_KEYS = frozenset({"const", "enum", "default", "examples"})
_STRING_LIMITS = ("maxLength", "enum", "const", "pattern", "format")
_LOG_PREFIX = re.compile(r"^\[[\d:.]+\]\s*(\S+:\d+:\s*)?")


class GrammarError(ValueError):
    """The schema cannot be compiled into a grammar (unsupported or malformed)."""


class XGrammarGuide:
    """One sequence's grammar state: masks logits, follows accepted tokens, knows when done."""

    __slots__ = ("_apply_bitmask", "_bitmask", "_matcher", "_vocab_size")

    def __init__(self, compiled: xgr.CompiledGrammar, vocab_size: int) -> None:
        import xgrammar as xgr  # loaded already: a compiled grammar exists

        self._matcher = xgr.GrammarMatcher(compiled)
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)
        self._apply_bitmask = xgr.apply_token_bitmask_inplace
        self._vocab_size = vocab_size

    def mask_logits(self, logits_row: torch.Tensor) -> None:
        """Set the logits of tokens the grammar forbids next to -inf, in place."""
        self._matcher.fill_next_token_bitmask(self._bitmask)
        row = logits_row.view(1, -1)
        self._apply_bitmask(row, self._bitmask.to(row.device), vocab_size=self._vocab_size)
        if row.shape[1] > self._vocab_size:
            row[:, self._vocab_size :] = float("-inf")

    def accept(self, token_id: int) -> None:
        """Advance the grammar by the sampled token (always one the mask allowed)."""
        if not self._matcher.accept_token(token_id):
            raise ValueError(f"token {token_id} is not allowed by the grammar")

    def is_terminated(self) -> bool:
        """True once the JSON is complete and the stop token was accepted."""
        return self._matcher.is_terminated()


class CompiledGuide:
    """A compiled grammar; :meth:`factory` is what ``SamplingParams.guide_factory`` takes."""

    __slots__ = ("_compiled", "_vocab_size")

    def __init__(self, compiled: xgr.CompiledGrammar, vocab_size: int) -> None:
        self._compiled = compiled
        self._vocab_size = vocab_size

    def factory(self) -> Callable[[], XGrammarGuide]:
        """A zero-argument callable that makes a fresh guide per sequence."""
        return lambda: XGrammarGuide(self._compiled, self._vocab_size)


class GrammarCompiler:
    """Compiles JSON schemas against one tokenizer (thread-safe; compiled grammars are
    cached, up to ``GRAMMAR_CACHE_BYTES``).

    Cheap to build: xgrammar and its view of the tokenizer are set up by the first compile.
    """

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: Iterable[int],
        max_string_length: int = DEFAULT_MAX_STRING_LENGTH,
        max_items: int = DEFAULT_MAX_ITEMS,
    ) -> None:
        self._tokenizer = tokenizer
        self._stop_token_ids = sorted(stop_token_ids)
        self._vocab_size = vocab_size
        self._max_string_length = max_string_length
        self._max_items = max_items
        self._compiler: xgr.GrammarCompiler | None = None
        self._setup_lock = threading.Lock()

    def _xgrammar_compiler(self) -> xgr.GrammarCompiler:
        with self._setup_lock:
            if self._compiler is None:
                # xgrammar: loaded when the first grammar is compiled.
                import xgrammar as xgr

                info = xgr.TokenizerInfo.from_huggingface(
                    self._tokenizer,
                    vocab_size=self._vocab_size,
                    stop_token_ids=self._stop_token_ids,
                )
                self._compiler = xgr.GrammarCompiler(
                    info, max_threads=1, cache_limit_bytes=GRAMMAR_CACHE_BYTES
                )
            return self._compiler

    def json_schema(self, schema: dict[str, Any], strict: bool = True) -> CompiledGuide:
        """Grammar of the JSON documents that validate against ``schema``.

        ``strict`` forbids properties the schema does not name (OpenAI's strict mode);
        without it, extra properties are allowed wherever the schema allows them.
        Open strings and arrays get the compiler's bounds (see :func:`bounded`).
        """
        schema = bounded(schema, self._max_string_length, self._max_items)
        compiler = self._xgrammar_compiler()
        try:
            compiled = compiler.compile_json_schema(
                json.dumps(schema), any_whitespace=False, strict_mode=strict
            )
        except (RuntimeError, ValueError, TypeError) as exc:
            raise GrammarError(f"The JSON schema cannot be enforced: {_reason(exc)}.") from exc
        return CompiledGuide(compiled, self._vocab_size)

    def json_object(self) -> CompiledGuide:
        """Grammar of any JSON object (``response_format: json_object``)."""
        return self.json_schema(ANY_JSON_OBJECT, strict=False)


def bounded(schema: Any, max_string_length: int, max_items: int) -> Any:
    """A copy of ``schema`` where unbounded strings get ``maxLength`` and arrays ``maxItems``.

    Strings already limited by length, enum, const, pattern or format keep their
    limits; a ``minLength``/``minItems`` above the default raises the bound to it.
    """
    if isinstance(schema, list):
        return [bounded(item, max_string_length, max_items) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {
        key: value if key in _LITERAL_KEYS else bounded(value, max_string_length, max_items)
        for key, value in schema.items()
    }
    types = out.get("type")
    types = types if isinstance(types, list) else [types]
    if "string" in types and not any(k in out for k in _STRING_LIMITS):
        out["maxLength"] = max(max_string_length, int(out.get("minLength", 0)))
    if "array" in types and "maxItems" not in out:
        out["maxItems"] = max(max_items, int(out.get("minItems", 0)))
    return out


def _reason(exc: BaseException) -> str:
    """xgrammar's reason, without the time and C++ source line it starts with
    (``[14:26:17] /project/cpp/json_schema_converter.cc:5082: Unsupported type "x"``)."""
    lines = str(exc).strip().splitlines()
    reason = _LOG_PREFIX.sub("", lines[0]).strip().rstrip(".") if lines else ""
    return reason or "xgrammar does not support it"
