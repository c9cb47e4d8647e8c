"""How many tokens a text has at least, read from its length alone.

Tokenizing a 2 MiB prompt costs a prompt worker ~4 s, and freeing the result pauses
every thread of the server for 0.1–0.3 s; a prompt that long cannot fit any usual
``max_model_len`` anyway. Where no token covers more than ``K`` bytes of the text and
every byte lands in some token, a text of ``B`` bytes has at least ``ceil(B / K)``
tokens, so a prompt past ``K * max_model_len`` bytes is refused before it is tokenized.

That holds only for a tokenizer without a normalizer (NFC and the like fold several
characters into one), whose pre-tokenizer drops nothing (ByteLevel, Metaspace, Digits,
Punctuation, a Split that keeps its matches), whose BPE never folds a run of unknown
characters into one token, and none of whose added tokens takes the spaces around it.
Any other tokenizer gets no bound and every text is tokenized as before.
"""

from __future__ import annotations

import json
from typing import Any

from inhouse.engine.errors import EngineInputError

KEEPS_EVERY_BYTE = frozenset({"ByteLevel", "Metaspace", "Digits", "Punctuation", "Split"})


def max_token_bytes(tokenizer: Any) -> int | None:
    """``K``: the most UTF-8 bytes any token's text has, or None where no token count can
    be bounded from length (see the module's conditions). ``tokenizer`` is a transformers
    fast tokenizer; a slow one has no backend to read and gets None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    if spec.get("normalizer") is not None or not _keeps_every_byte(spec.get("pre_tokenizer")):
        return None
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return None
    folds_unknowns = model.get("unk_token") is not None and model.get("fuse_unk", False)
    if folds_unknowns and not model.get("byte_fallback", False):
        return None
    added = list(backend.get_added_tokens_decoder().values())
    if any(token.lstrip or token.rstrip for token in added):  # absorbs a run of spaces
        return None
    vocab = list(backend.get_vocab(with_added_tokens=False))
    byte_level = "ByteLevel" in _kinds(spec.get("pre_tokenizer"))  # one character a byte
    lengths = [len(text) if byte_level else len(text.encode()) for text in vocab]
    lengths += [len(token.content.encode()) for token in added]  # matched in the raw text
    return max(lengths, default=None)


def _kinds(pre_tokenizer: dict | None) -> set[str]:
    if pre_tokenizer is None:
        return set()
    inner = pre_tokenizer.get("pretokenizers", [])
    return {pre_tokenizer.get("type", "")}.union(*(_kinds(p) for p in inner))


def _keeps_every_byte(pre_tokenizer: dict | None) -> bool:
    if pre_tokenizer is None:
        return True
    kind = pre_tokenizer.get("type")
    if kind == "Sequence":
        return all(_keeps_every_byte(p) for p in pre_tokenizer.get("pretokenizers", []))
    if kind == "Split" and pre_tokenizer.get("behavior") == "Removed":
        return False
    return kind in KEEPS_EVERY_BYTE


def refuse_surely_too_long(text: str, token_bytes: int | None, max_model_len: int) -> None:
    """Raise the engine's prompt-too-long error if ``text`` has at least ``max_model_len``
    tokens by its length alone (a no-op where ``token_bytes`` is None)."""
    if token_bytes is None:
        return
    size = len(text.encode())
    at_least = -(-size // token_bytes)
    if at_least >= max_model_len:
        raise EngineInputError(
            f"the prompt has at least {at_least} tokens ({size} bytes, and no token is "
            f"longer than {token_bytes}), but max_model_len is {max_model_len} and at least "
            "one token must be left for the output",
            "prompt",
        )
