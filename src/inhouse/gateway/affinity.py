"""Prefix affinity: which replica most likely still holds a request's prompt prefix.

Engines cache the KV of prompt prefixes they computed (inhouse and vLLM in blocks, llama.cpp
in its slots), and the gateway cannot see those caches. So it keeps its own account: the
prompt's text, as the engine renders it in order (tools, then each message's role and
content; a completion's prompt), is cut into blocks of `BLOCK_CHARS` characters, and each
block's hash is chained on the one before, rooted in the tenant's cache salt, so a block's
hash names the whole prefix up to it, and one tenant's prefix never matches another's.
Each replica remembers the hashes of the prompts sent to it, the most recent
`REMEMBERED_BLOCKS` of them. A request goes to the ready replica that shares the longest
run of its leading blocks, unless that replica carries more than `slack` requests above the
least-loaded one (then, and when no replica shares a block, the least-loaded one takes it).

It is an estimate: characters stand for tokens (about four a token in English), an engine
may have evicted what the account still holds, and a replica that restarts is forgotten
(`Backend` clears it when it goes down or starts again).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

BLOCK_CHARS = 256  # about 64 tokens: a few of the engines' KV blocks
MAX_BLOCKS = 512  # blocks hashed per prompt: its first ~128k characters
REMEMBERED_BLOCKS = 65_536  # per replica: ~16M characters, ~4M tokens of prompts
DIGEST_BYTES = 16
HASHED_CHARS = BLOCK_CHARS * MAX_BLOCKS


def prompt_text(endpoint: str, body: dict[str, Any]) -> str:
    """The request's prompt in the order an engine renders it (tools first, then each
    message's role and content), as far as `prefix_chain` reads it; "" where the request
    has no prompt to cache."""
    if endpoint == "chat/completions":
        messages = body.get("messages")
        if not isinstance(messages, list):
            return ""
        parts = [json.dumps(body["tools"], sort_keys=True)] if body.get("tools") else []
        length = sum(map(len, parts))
        for message in messages:
            if length >= HASHED_CHARS:
                break  # the rest of a long conversation is never hashed
            if isinstance(message, dict):
                content = message.get("content")
                text = content if isinstance(content, str) else json.dumps(content)
                parts.append(f"{message.get('role')}\x1f{text}")
                length += len(parts[-1]) + 1
        return "\x1e".join(parts)
    if endpoint == "completions":
        prompt = body.get("prompt")
        return prompt if isinstance(prompt, str) else ""
    return ""


def prefix_chain(salt: str, text: str) -> tuple[bytes, ...]:
    """The chained hashes of `text`'s whole blocks (a partial last block is no prefix an
    engine caches), rooted in the tenant's `salt`."""
    chain: list[bytes] = []
    previous = hashlib.blake2b(salt.encode(), digest_size=DIGEST_BYTES).digest()
    whole = min(len(text) // BLOCK_CHARS, MAX_BLOCKS)
    for index in range(whole):
        block = text[index * BLOCK_CHARS : (index + 1) * BLOCK_CHARS].encode()
        previous = hashlib.blake2b(previous + block, digest_size=DIGEST_BYTES).digest()
        chain.append(previous)
    return tuple(chain)


class PrefixMemory:
    """The block hashes last sent to one replica, oldest first, at most `capacity`."""

    def __init__(self, capacity: int = REMEMBERED_BLOCKS) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def shared(self, chain: Sequence[bytes]) -> int:
        """How many of `chain`'s leading blocks this replica was sent."""
        count = 0
        for block in chain:
            if block not in self._blocks:
                break
            count += 1
        return count

    def remember(self, chain: Sequence[bytes]) -> None:
        """Note `chain` as sent here (its blocks the most recent), forgetting the oldest."""
        for block in chain:
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def forget(self) -> None:
        self._blocks.clear()

    def __len__(self) -> int:
        return len(self._blocks)
