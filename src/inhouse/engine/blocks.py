"""The block pool: paged-KV accounting with ref counts, an LRU free queue and a prefix cache.

Every KV block is always in exactly one of two places: held (``ref_cnt > 0``) by
one or more sequences, or in the free queue. A free block may still carry the
hash of the full block of tokens whose K/V it holds; a later request with the
same prefix takes it back out of the queue (a prefix-cache hit). Blocks are
reused from the queue's front (least recently freed first), and only then lose
their hash.

Hash chain (as vLLM v1): ``H(parent_hash, block_token_ids, extra_keys)`` with
SHA-256, over full blocks only; the cache salt is an extra key of the first
block, so it changes the whole chain. The collision guard stores each cached
block's key and compares it on every hit.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

BlockKey = tuple[bytes, tuple[int, ...], bytes]


def block_key(parent_hash: bytes, token_ids: Sequence[int], extra: bytes = b"") -> BlockKey:
    """What a full block's hash is computed from; kept with a cached block as collision guard."""
    return (parent_hash, tuple(token_ids), extra)


def hash_block_key(key: BlockKey) -> bytes:
    """SHA-256 of a block key, with lengths framed so different keys never serialize alike."""
    parent, tokens, extra = key
    digest = hashlib.sha256()
    digest.update(struct.pack("<III", len(parent), len(tokens), len(extra)))
    digest.update(parent)
    digest.update(struct.pack(f"<{len(tokens)}q", *tokens))
    digest.update(extra)
    return digest.digest()


def salt_key(cache_salt: str | None) -> bytes:
    """The extra key of a sequence's first block: its tenant salt (empty without one)."""
    return b"" if cache_salt is None else b"salt:" + cache_salt.encode()


def adapter_key(digest: str | None) -> bytes:
    """The first block's key beside the salt: the LoRA adapter's digest (empty for the base),
    so one adapter's blocks never answer another's prompt."""
    return b"" if digest is None else b"adapter:" + digest.encode()


@dataclass(slots=True, eq=False)
class KVBlock:
    """One block of KV slots; ``key``/``block_hash`` set while it holds a cached full block."""

    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None
    key: BlockKey | None = None
    prev: KVBlock | None = field(default=None, repr=False)
    next: KVBlock | None = field(default=None, repr=False)


class FreeBlockQueue:
    """Doubly linked list of free blocks: O(1) append, pop from the front, remove anywhere."""

    def __init__(self, blocks: Iterable[KVBlock]) -> None:
        self._head = KVBlock(-1)
        self._tail = KVBlock(-1)
        self._head.next = self._tail
        self._tail.prev = self._head
        self.num_free = 0
        for block in blocks:
            self.append(block)

    def append(self, block: KVBlock) -> None:
        last = self._tail.prev
        assert last is not None
        last.next = block
        block.prev = last
        block.next = self._tail
        self._tail.prev = block
        self.num_free += 1

    def popleft(self) -> KVBlock:
        block = self._head.next
        if block is None or block is self._tail:
            raise IndexError("no free KV blocks")
        self.remove(block)
        return block

    def remove(self, block: KVBlock) -> None:
        assert block.prev is not None and block.next is not None
        block.prev.next = block.next
        block.next.prev = block.prev
        block.prev = block.next = None
        self.num_free -= 1

    def __iter__(self):
        block = self._head.next
        while block is not None and block is not self._tail:
            yield block
            block = block.next


class BlockPool:
    """All KV blocks of the cache, their ref counts, and the hash → cached block map."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"the block pool needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[bytes, KVBlock] = {}

    @property
    def num_free(self) -> int:
        return self.free_queue.num_free

    @property
    def usage(self) -> float:
        """Fraction of blocks held by sequences (free cached blocks count as free)."""
        return 1.0 - self.num_free / self.num_blocks

    def allocate(self, count: int) -> list[KVBlock]:
        """Take ``count`` blocks from the front of the free queue, evicting their hashes."""
        if count > self.num_free:
            raise ValueError(f"asked for {count} KV blocks, only {self.num_free} free")
        taken = []
        for _ in range(count):
            block = self.free_queue.popleft()
            self._evict(block)
            block.ref_cnt = 1
            taken.append(block)
        return taken

    def lookup(self, block_hash: bytes, key: BlockKey) -> KVBlock | None:
        """The cached block for this hash if its stored key matches (collision guard)."""
        block = self.cached.get(block_hash)
        if block is None or block.key != key:
            return None
        return block

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take a reference on cache-hit blocks, pulling free ones out of the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free(self, blocks: Iterable[KVBlock]) -> None:
        """Drop one reference on each block; pass a sequence's tail first so it is evicted first."""
        for block in blocks:
            assert block.ref_cnt > 0, f"block {block.block_id} freed more often than held"
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.append(block)

    def cache(self, block: KVBlock, block_hash: bytes, key: BlockKey) -> None:
        """Record that ``block`` holds the full block ``key``, unless that hash is cached."""
        if block.block_hash is not None or block_hash in self.cached:
            return
        block.block_hash = block_hash
        block.key = key
        self.cached[block_hash] = block

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is None:
            return
        if self.cached.get(block.block_hash) is block:
            del self.cached[block.block_hash]
        block.block_hash = None
        block.key = None
