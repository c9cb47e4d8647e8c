"""Per-sequence KV bookkeeping on top of the block pool: prefix lookup, slots, caching, freeing.

With prefix caching off, blocks are still hashed, but under a per-request salt, so
only the ``n`` siblings of one request share their prompt's blocks. Where a prompt's rows
are attended on bf16 products and a generated token's are not (``generated_apart``), a block
that holds a generated token is hashed apart: a later prompt of the same tokens (the next
turn of a chat) computes them as a prompt and finds only what a prompt computed, so its
bits never depend on what the cache held. A LoRA adapter's blocks are keyed by its
files' digest: they answer only the same adapter's prompts. A block that holds an image's
tokens is keyed by that image's digest as well: its token ids say only that an image is there.
"""

from __future__ import annotations

from dataclasses import dataclass

from inhouse.engine.blocks import (
    BlockPool,
    KVBlock,
    adapter_key,
    block_key,
    hash_block_key,
    salt_key,
)
from inhouse.engine.images import image_block_key
from inhouse.engine.sequence import Sequence


@dataclass(slots=True)
class PrefixCacheCounters:
    """Prefix-cache lookups, in tokens (vLLM's ``prefix_cache_queries`` / ``_hits``)."""

    queries: int = 0
    hits: int = 0


class KVCacheManager:
    """Gives sequences KV slots, shares cached prefix blocks, returns blocks when done."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        generated_apart: bool = False,
    ) -> None:
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.generated_apart = generated_apart
        self.counters = PrefixCacheCounters()
        self._num_registered: dict[int, int] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def find_cached_prefix(self, seq: Sequence) -> list[KVBlock]:
        """The longest run of cached full blocks that starts the sequence (leaves ≥ 1 token)."""
        max_blocks = (seq.num_tokens - 1) // self.block_size
        self._extend_hashes(seq, max_blocks)
        hits: list[KVBlock] = []
        for i in range(max_blocks):
            block = self.pool.lookup(seq.block_hashes[i], self._key(seq, i))
            if block is None:
                break
            hits.append(block)
        return hits

    def record_lookup(self, num_tokens: int, num_cached_tokens: int) -> None:
        """Count one admitted sequence's prefix lookup (in tokens) for the metrics."""
        if self.enable_prefix_caching:
            self.counters.queries += num_tokens
            self.counters.hits += num_cached_tokens

    def allocate_slots(
        self, seq: Sequence, num_new_tokens: int, cached: list[KVBlock] | None = None
    ) -> bool:
        """Extend the block table to cover ``num_new_tokens`` more tokens; False if out of blocks.

        ``cached`` are prefix-cache hits (from ``find_cached_prefix``) that come
        before the new tokens; the caller then advances ``num_computed_tokens`` past them.
        """
        cached = cached or []
        covered = seq.num_computed_tokens + len(cached) * self.block_size + num_new_tokens
        num_new_blocks = self.blocks_for_tokens(covered) - len(seq.block_table) - len(cached)
        revived = sum(1 for block in cached if block.ref_cnt == 0)
        if max(num_new_blocks, 0) + revived > self.pool.num_free:
            return False
        self.pool.touch(cached)
        seq.block_table.extend(block.block_id for block in cached)
        if cached:
            self._num_registered[seq.seq_id] = len(seq.block_table)
        if num_new_blocks > 0:
            seq.block_table.extend(b.block_id for b in self.pool.allocate(num_new_blocks))
        return True

    def cache_computed_blocks(self, seq: Sequence) -> None:
        """Register the sequence's newly computed full blocks in the prefix cache."""
        num_full = seq.num_computed_tokens // self.block_size
        start = self._num_registered.get(seq.seq_id, 0)
        if num_full <= start:
            return
        self._extend_hashes(seq, num_full)
        for i in range(start, num_full):
            block = self.pool.blocks[seq.block_table[i]]
            self.pool.cache(block, seq.block_hashes[i], self._key(seq, i))
        self._num_registered[seq.seq_id] = num_full

    def release_beyond(self, seq: Sequence, num_tokens: int) -> None:
        """Return the blocks past the first ``num_tokens`` tokens (rejected draft tokens'),
        tail first; those blocks were never hashed, as their tokens were never final."""
        keep = self.blocks_for_tokens(num_tokens)
        if len(seq.block_table) > keep:
            self.pool.free(self.pool.blocks[i] for i in reversed(seq.block_table[keep:]))
            del seq.block_table[keep:]

    def free(self, seq: Sequence) -> None:
        """Return all of the sequence's blocks, tail first, and reset its table."""
        self.pool.free(self.pool.blocks[i] for i in reversed(seq.block_table))
        seq.block_table = []
        self._num_registered.pop(seq.seq_id, None)

    def _key(self, seq: Sequence, index: int):
        size = self.block_size
        parent = seq.block_hashes[index - 1] if index else b""
        extra = self._first_block_extra(seq) if index == 0 else b""
        if seq.images:
            extra += image_block_key(seq.images, index * size, (index + 1) * size)
        if self.generated_apart and (index + 1) * size > seq.num_prompt_tokens:
            extra += b"generated"
        return block_key(parent, seq.token_ids[index * size : (index + 1) * size], extra)

    def _first_block_extra(self, seq: Sequence) -> bytes:
        if self.enable_prefix_caching:
            adapter = None if seq.adapter is None else seq.adapter.digest
            return salt_key(seq.cache_salt) + adapter_key(adapter)
        return b"request:" + seq.request_id.encode()

    def _extend_hashes(self, seq: Sequence, num_blocks: int) -> None:
        hashes = seq.block_hashes
        for i in range(len(hashes), min(num_blocks, seq.num_tokens // self.block_size)):
            hashes.append(hash_block_key(self._key(seq, i)))
