"""Block pool and KV cache manager: ref counts, LRU free queue, salted hash chain, guard."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from inhouse.engine.blocks import BlockPool, block_key, hash_block_key
from inhouse.engine.kv_cache import KVCacheManager
from inhouse.engine.sampling import SamplingParams
from inhouse.engine.sequence import Sequence

BS = 4


def make_seq(tokens: list[int], salt: str | None = None, request_id: str = "r") -> Sequence:
    return Sequence(request_id, list(tokens), SamplingParams(), cache_salt=salt)


def admit(kv: KVCacheManager, seq: Sequence) -> bool:
    """What the scheduler does for a waiting sequence: reuse the cached prefix, compute the rest."""
    cached = kv.find_cached_prefix(seq)
    num_cached = len(cached) * kv.block_size
    if not kv.allocate_slots(seq, seq.num_tokens - num_cached, cached):
        return False
    seq.num_computed_tokens = seq.num_tokens
    kv.cache_computed_blocks(seq)
    return True


def test_hash_covers_parent_tokens_and_extra():
    base = hash_block_key(block_key(b"", [1, 2, 3, 4]))
    assert len(base) == 32
    assert hash_block_key(block_key(b"", [1, 2, 3, 4])) == base
    assert hash_block_key(block_key(b"p", [1, 2, 3, 4])) != base
    assert hash_block_key(block_key(b"", [1, 2, 3, 5])) != base
    assert hash_block_key(block_key(b"", [1, 2, 3, 4], b"salt:a")) != base


def test_second_request_with_same_prefix_hits_full_blocks_only():
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    first = make_seq(list(range(10)))
    assert admit(kv, first)
    second = make_seq([*range(10), 99, 98])
    hits = kv.find_cached_prefix(second)
    assert [b.block_id for b in hits] == first.block_table[:2]  # 2 full blocks; 2 tokens partial


def test_hit_leaves_at_least_one_token_to_compute():
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    assert admit(kv, make_seq(list(range(8))))
    assert len(kv.find_cached_prefix(make_seq(list(range(8))))) == 1


def test_different_salt_never_shares_and_salt_changes_whole_chain():
    kv = KVCacheManager(num_blocks=16, block_size=BS)
    tenant_a = make_seq(list(range(12)), salt="a")
    assert admit(kv, tenant_a)
    assert kv.find_cached_prefix(make_seq(list(range(13)), salt="b")) == []
    assert kv.find_cached_prefix(make_seq(list(range(13)))) == []
    assert len(kv.find_cached_prefix(make_seq(list(range(13)), salt="a"))) == 3
    unsalted = make_seq(list(range(12)))
    kv._extend_hashes(unsalted, 3)
    assert not set(unsalted.block_hashes) & set(tenant_a.block_hashes)


def test_collision_guard_rejects_block_whose_stored_tokens_differ():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    victim = make_seq([1, 2, 3, 4, 5])
    assert admit(kv, victim)
    block = kv.pool.blocks[victim.block_table[0]]
    # Pretend another token block hashed to the same digest: its stored key differs.
    block.key = block_key(b"", [9, 9, 9, 9])
    assert kv.find_cached_prefix(make_seq([1, 2, 3, 4, 5])) == []


def test_freed_cached_blocks_are_reused_lru_tail_first_and_lose_their_hash():
    pool = BlockPool(4)
    blocks = pool.allocate(4)
    for i, block in enumerate(blocks):
        key = block_key(b"", [i])
        pool.cache(block, hash_block_key(key), key)
    pool.free(reversed(blocks))  # a sequence frees its tail first
    [reused] = pool.allocate(1)
    assert reused is blocks[-1]
    assert reused.block_hash is None and len(pool.cached) == 3


def test_hit_on_free_cached_block_takes_it_out_of_free_queue():
    kv = KVCacheManager(num_blocks=4, block_size=BS)
    first = make_seq(list(range(9)))
    assert admit(kv, first)
    first_blocks = list(first.block_table)
    kv.free(first)
    assert kv.num_free_blocks == 4
    again = make_seq(list(range(9)))
    assert admit(kv, again)
    assert again.block_table[:2] == first_blocks[:2]
    assert kv.num_free_blocks == 1
    assert all(kv.pool.blocks[i].ref_cnt == 1 for i in again.block_table)


def test_allocation_fails_cleanly_when_pool_is_short():
    kv = KVCacheManager(num_blocks=2, block_size=BS)
    seq = make_seq(list(range(12)))
    assert not kv.allocate_slots(seq, 12)
    assert seq.block_table == [] and kv.num_free_blocks == 2


def test_shared_blocks_count_references():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    a, b = make_seq(list(range(9))), make_seq(list(range(9)))
    assert admit(kv, a) and admit(kv, b)
    shared = kv.pool.blocks[a.block_table[0]]
    assert b.block_table[0] == shared.block_id and shared.ref_cnt == 2
    kv.free(a)
    assert shared.ref_cnt == 1
    kv.free(b)
    assert shared.ref_cnt == 0 and kv.num_free_blocks == 8


def test_pool_rejects_empty_and_over_allocation():
    with pytest.raises(ValueError, match="at least one block"):
        BlockPool(0)
    with pytest.raises(ValueError, match="only 2 free"):
        BlockPool(2).allocate(3)


class BlockPoolMachine(RuleBasedStateMachine):
    """Random admit / grow / free / preempt sequences keep the pool's invariants."""

    def __init__(self) -> None:
        super().__init__()
        self.kv = KVCacheManager(num_blocks=12, block_size=BS)
        self.live: list[Sequence] = []

    @rule(
        tokens=st.lists(st.integers(0, 2), min_size=1, max_size=20),
        salt=st.sampled_from([None, "a", "b"]),
    )
    def admit_sequence(self, tokens: list[int], salt: str | None) -> None:
        seq = make_seq(tokens, salt)
        if admit(self.kv, seq):
            self.live.append(seq)
        else:
            assert seq.block_table == []

    @precondition(lambda self: self.live)
    @rule(data=st.data(), extra=st.lists(st.integers(0, 2), min_size=1, max_size=6))
    def grow(self, data: st.DataObject, extra: list[int]) -> None:
        seq = data.draw(st.sampled_from(self.live))
        seq.token_ids.extend(extra)
        if self.kv.allocate_slots(seq, len(extra)):
            seq.num_computed_tokens = seq.num_tokens
            self.kv.cache_computed_blocks(seq)
        else:
            del seq.token_ids[-len(extra) :]

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(self.live))
        self.kv.free(seq)
        self.live.remove(seq)

    @invariant()
    def accounting_holds(self) -> None:
        pool = self.kv.pool
        used = [b for b in pool.blocks if b.ref_cnt > 0]
        assert all(b.ref_cnt >= 0 for b in pool.blocks)
        assert pool.num_free + len(used) == pool.num_blocks
        assert sorted(b.block_id for b in pool.free_queue) == sorted(
            b.block_id for b in pool.blocks if b.ref_cnt == 0
        )
        holders = {b.block_id: 0 for b in pool.blocks}
        for seq in self.live:
            for block_id in seq.block_table:
                holders[block_id] += 1
        assert all(pool.blocks[i].ref_cnt == n for i, n in holders.items())

    @invariant()
    def cached_hashes_name_the_tokens_their_blocks_hold(self) -> None:
        for block_hash, block in self.kv.pool.cached.items():
            assert block.block_hash == block_hash
            assert hash_block_key(block.key) == block_hash
        for seq in self.live:
            for i, block_id in enumerate(seq.block_table):
                block = self.kv.pool.blocks[block_id]
                if block.key is not None:
                    assert list(block.key[1]) == seq.token_ids[i * BS : (i + 1) * BS]

    def teardown(self) -> None:
        for seq in self.live:
            self.kv.free(seq)
        assert self.kv.num_free_blocks == self.kv.pool.num_blocks


TestBlockPoolMachine = BlockPoolMachine.TestCase
TestBlockPoolMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
