"""Prompt text to ids, cheaply. The token count a text has at least by its length: never
above the tokenizer's real count (the bundled SmolLM2's and a tiny byte-level BPE's), and
no bound at all for tokenizers where length says nothing (a normalizer, a pre-tokenizer
that drops spaces, a model that folds unknown runs). The offset-free encode: the
tokenizer's own ids."""

from __future__ import annotations

import random

import pytest
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from inhouse.engine.errors import EngineInputError
from inhouse.engine.fast_encode import encode
from inhouse.engine.prompt_bound import max_token_bytes, refuse_surely_too_long
from tiny_models import _tiny_tokenizer


def _texts(tokenizer: PreTrainedTokenizerFast, seed: int) -> list[str]:
    """Texts built to be few tokens per byte: runs of the vocab's longest tokens, runs of
    spaces and dashes, plus random unicode, random bytes-as-text and templated chat."""
    rng = random.Random(seed)
    vocab = sorted(tokenizer.get_vocab(), key=lambda t: -len(t))
    longest = [tokenizer.convert_tokens_to_string([t]) for t in vocab[:50]]
    texts = [
        "".join(rng.choice(longest) for _ in range(200)),
        " " * 5000,
        "-" * 5000,
        "\n" * 3000,
        "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(3000)),
        "<|im_start|>" * 300,
        bytes(rng.randrange(256) for _ in range(3000)).decode("latin-1"),
    ]
    return texts + ["".join(rng.choice(texts)[:97] for _ in range(40)) for _ in range(20)]


@pytest.mark.parametrize("which", ["bundled", "tiny"])
def test_the_bound_never_exceeds_the_real_count(which: str, bundled_model_fp32) -> None:
    tokenizer = bundled_model_fp32.tokenizer if which == "bundled" else _tiny_tokenizer()
    token_bytes = max_token_bytes(tokenizer)
    assert token_bytes is not None and token_bytes > 1
    for text in _texts(tokenizer, seed=len(which)):
        real = len(tokenizer.encode(text, add_special_tokens=False))
        at_least = -(-len(text.encode()) // token_bytes)
        assert at_least <= real, (text[:60], at_least, real)


def test_a_text_is_refused_exactly_when_its_length_proves_it_too_long() -> None:
    tokenizer = _tiny_tokenizer()
    token_bytes = max_token_bytes(tokenizer)
    assert token_bytes is not None
    limit = 100
    refuse_surely_too_long("a" * (token_bytes * (limit - 1)), token_bytes, limit)
    with pytest.raises(EngineInputError, match="max_model_len is 100") as refused:
        refuse_surely_too_long("a" * (token_bytes * (limit - 1) + 1), token_bytes, limit)
    assert refused.value.param == "prompt"
    assert len(tokenizer.encode("a" * (token_bytes * (limit - 1) + 1))) >= limit
    refuse_surely_too_long("é" * 10**6, None, limit)  # no bound: nothing refused here


def _wrapped(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def _byte_level_bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2}, merges=[("a", "b")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tok


def test_no_bound_where_length_says_nothing() -> None:
    assert max_token_bytes(_wrapped(_byte_level_bpe())) == 2
    normalized = _byte_level_bpe()
    normalized.normalizer = normalizers.NFC()
    assert max_token_bytes(_wrapped(normalized)) is None
    dropping = _byte_level_bpe()
    dropping.pre_tokenizer = pre_tokenizers.Whitespace()
    assert max_token_bytes(_wrapped(dropping)) is None
    removed = _byte_level_bpe()
    removed.pre_tokenizer = pre_tokenizers.Split(" ", behavior="removed")
    assert max_token_bytes(_wrapped(removed)) is None
    unknowns = models.BPE(vocab={"<unk>": 0, "a": 1}, merges=[], unk_token="<unk>", fuse_unk=True)
    fused = Tokenizer(unknowns)
    assert max_token_bytes(_wrapped(fused)) is None
    assert len(fused.encode("xxxxxxxxxx").ids) == 1  # ten bytes, one token: why
    word_piece = Tokenizer(models.WordPiece(vocab={"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    assert max_token_bytes(_wrapped(word_piece)) is None
    stripping = _byte_level_bpe()
    stripping.add_special_tokens([AddedToken("<m>", lstrip=True)])
    assert len(stripping.encode(" " * 1000 + "<m>").ids) == 1  # 1,003 bytes, one token: why
    assert max_token_bytes(_wrapped(stripping)) is None


def test_an_added_token_counts_its_bytes_under_byte_level() -> None:
    """Added tokens are matched in the raw text, so a multibyte one covers its UTF-8 bytes,
    not one byte a character as the byte-level vocabulary's entries do."""
    tok = _byte_level_bpe()
    tok.add_special_tokens(["<｜begin▁of▁sentence｜>"])  # 21 characters, 29 bytes
    assert max_token_bytes(_wrapped(tok)) == 29
    assert len(tok.encode("<｜begin▁of▁sentence｜>").ids) == 1


@pytest.mark.parametrize("which", ["bundled", "tiny"])
@pytest.mark.parametrize("specials", [True, False])
def test_the_fast_encode_gives_the_tokenizers_own_ids(
    which: str, specials: bool, bundled_model_fp32
) -> None:
    tokenizer = bundled_model_fp32.tokenizer if which == "bundled" else _tiny_tokenizer()
    for text in [*_texts(tokenizer, seed=7), "", "<|im_start|>user\nhi<|im_end|>", " a  b "]:
        expected = tokenizer.encode(text, add_special_tokens=specials)
        assert encode(tokenizer, text, add_special_tokens=specials) == expected, text[:60]
