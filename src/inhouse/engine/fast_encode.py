"""Prompt text to token ids through the Rust tokenizer's offset-free path.

``tokenizer.encode`` asks the Rust side for offsets and keeps every token's text, which
the server never reads: on a 2 MiB prompt that is 2.6 s instead of 1.1 s, and freeing the
result holds the GIL for 0.1 s (every stream of the server pauses) instead of 5 ms.
``encode_batch_fast`` gives the same ids and releases the GIL while it works.
"""

from __future__ import annotations

from typing import Any


def encode(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
    """``tokenizer.encode(text, add_special_tokens=...)``'s ids; a slow tokenizer (no Rust
    backend) is asked directly."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return tokenizer.encode(text, add_special_tokens=add_special_tokens)
    return backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids
