"""Block pool and KV cache manager: ref counts, LRU free queue, salted hash chain, guard.

Sequences get their blocks the way the engine gives them: through the real
``Scheduler.schedule`` and ``Scheduler.update`` (see ``admit``)."""

from __future__ import annotations

import itertools

import pytest

from inhouse.engine.blocks import BlockPool, block_key, hash_block_key
from inhouse.engine.kv_cache import KVCacheManager
from inhouse.engine.sampler import SampledToken
from inhouse.engine.sampling_params import SamplingParams
from inhouse.engine.scheduler import Scheduler
from inhouse.engine.sequence import Sequence

BS = 4
_ids = itertools.count()


def make_seq(tokens: list[int], salt: str | None = None) -> Sequence:
    return Sequence(f"r{next(_ids)}", list(tokens), SamplingParams(max_tokens=4), cache_salt=salt)


def make_scheduler(num_blocks: int) -> Scheduler:
    return Scheduler(KVCacheManager(num_blocks, BS), 8, 64, 64, kv_reserve=0.0)


def admit(sched: Scheduler, seq: Sequence) -> bool:
    """One engine step for a new sequence: its prompt is computed (reusing the cached
    prefix) and one token sampled; False if the pool could not take it."""
    sched.add([seq])
    out = sched.schedule()
    sched.update(out, lambda rows, _seqs: [SampledToken(0) for _ in rows])
    if seq.block_table:
        return True
    sched.finish_request(seq.request_id, "abort")
    return False


def test_hash_covers_parent_tokens_and_extra():
    base = hash_block_key(block_key(b"", [1, 2, 3, 4]))
    assert len(base) == 32
    assert hash_block_key(block_key(b"", [1, 2, 3, 4])) == base
    assert hash_block_key(block_key(b"p", [1, 2, 3, 4])) != base
    assert hash_block_key(block_key(b"", [1, 2, 3, 5])) != base
    assert hash_block_key(block_key(b"", [1, 2, 3, 4], b"salt:a")) != base


def test_second_request_with_same_prefix_hits_full_blocks_only():
    sched = make_scheduler(16)
    kv = sched.kv_cache
    first = make_seq(list(range(10)))
    assert admit(sched, first)
    second = make_seq([*range(10), 99, 98])
    hits = kv.find_cached_prefix(second)
    assert [b.block_id for b in hits] == first.block_table[:2]  # 2 full blocks; 2 tokens partial


def test_hit_leaves_at_least_one_token_to_compute():
    sched = make_scheduler(16)
    kv = sched.kv_cache
    assert admit(sched, make_seq(list(range(8))))
    assert len(kv.find_cached_prefix(make_seq(list(range(8))))) == 1


def test_different_salt_never_shares_and_salt_changes_whole_chain():
    sched = make_scheduler(16)
    kv = sched.kv_cache
    tenant_a = make_seq(list(range(12)), salt="a")
    assert admit(sched, tenant_a)
    assert kv.find_cached_prefix(make_seq(list(range(13)), salt="b")) == []
    assert kv.find_cached_prefix(make_seq(list(range(13)))) == []
    assert len(kv.find_cached_prefix(make_seq(list(range(13)), salt="a"))) == 3
    unsalted = make_seq(list(range(12)))
    kv._extend_hashes(unsalted, 3)
    assert not set(unsalted.block_hashes) & set(tenant_a.block_hashes)


def test_collision_guard_rejects_block_whose_stored_tokens_differ():
    sched = make_scheduler(8)
    kv = sched.kv_cache
    victim = make_seq([1, 2, 3, 4, 5])
    assert admit(sched, victim)
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
    sched = make_scheduler(4)
    kv = sched.kv_cache
    first = make_seq(list(range(9)))
    assert admit(sched, first)
    first_blocks = list(first.block_table)
    sched.finish(first, "abort")
    assert kv.num_free_blocks == 4
    again = make_seq(list(range(9)))
    assert admit(sched, again)
    assert again.block_table[:2] == first_blocks[:2]
    assert kv.num_free_blocks == 1
    assert all(kv.pool.blocks[i].ref_cnt == 1 for i in again.block_table)


def test_allocation_fails_cleanly_when_pool_is_short():
    kv = KVCacheManager(num_blocks=2, block_size=BS)
    seq = make_seq(list(range(12)))
    assert not kv.allocate_slots(seq, 12)
    assert seq.block_table == [] and kv.num_free_blocks == 2


def test_shared_blocks_count_references():
    sched = make_scheduler(8)
    kv = sched.kv_cache
    a, b = make_seq(list(range(9))), make_seq(list(range(9)))
    assert admit(sched, a) and admit(sched, b)
    shared = kv.pool.blocks[a.block_table[0]]
    assert b.block_table[0] == shared.block_id and shared.ref_cnt == 2
    sched.finish(a, "abort")
    assert shared.ref_cnt == 1
    sched.finish(b, "abort")
    assert shared.ref_cnt == 0 and kv.num_free_blocks == 8


def test_pool_rejects_empty_and_over_allocation():
    with pytest.raises(ValueError, match="at least one block"):
        BlockPool(0)
    with pytest.raises(ValueError, match="only 2 free"):
        BlockPool(2).allocate(3)
