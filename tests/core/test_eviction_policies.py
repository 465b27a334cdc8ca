"""Eviction policies of the prefix cache (engine/core/eviction_policies.py): LFU keeps what is hit often where
LRU lets a scan flush it, a policy of your own is used as named, and bad names are refused by field."""

from __future__ import annotations

import pytest

from engine.core import CacheConfig, make_block_hasher
from engine.core.block_pool import BlockPool
from engine.core.eviction_policies import LeastFrequentlyUsed
from engine.core.free_block_queue import KVCacheBlock
from engine.core.kv_cache_manager import KVCacheManager

from tests.core.helpers import check_kv_invariants, make_request

BLOCK = 4
POPULAR = list(range(1000, 1000 + 4 * BLOCK))  # four blocks every "popular" request starts with


def request(request_id: str, prompt: list[int]):
    return make_request(request_id, prompt, block_hasher=make_block_hasher(BLOCK))


def run(manager: KVCacheManager, request) -> int:
    """Admit ``request`` with its prefix hit, compute its prompt, free it; the hit tokens."""
    blocks, hit = manager.get_computed_blocks(request)
    assert manager.allocate_slots(request, request.num_tokens - hit, hit, blocks) is not None
    request.num_computed_tokens = request.num_tokens
    manager.free(request)
    check_kv_invariants(manager)
    return hit


def popular_after_a_scan(policy: str) -> int:
    """A popular prompt hit three times, then a scan of one-off prompts that needs most of the pool: how much of
    the popular prefix is still cached afterwards."""
    manager = KVCacheManager(13, BLOCK, 1000, eviction_policy=policy)
    for index in range(4):
        run(manager, request(f"popular-{index}", POPULAR + [index]))
    for index in range(5):  # 15 blocks of one-off prompts through a pool of 12
        run(manager, request(f"scan-{index}", [5000 + 100 * index + i for i in range(3 * BLOCK)]))
    blocks, hit = manager.get_computed_blocks(request("popular-again", POPULAR + [99]))
    return hit


def test_lfu_keeps_a_popular_prefix_that_a_scan_flushes_under_lru():
    assert popular_after_a_scan("lru") == 0
    assert popular_after_a_scan("lfu") == 4 * BLOCK


def test_a_policy_of_your_own_orders_the_cached_blocks():
    pool = BlockPool(10, eviction_policy="tests.core.eviction_policy_examples:MostRecentlyFreedFirst")
    blocks = pool.get_new_blocks(4)
    for index, block in enumerate(blocks):
        block.block_hash = bytes([index])
    pool.free_blocks(blocks)  # cached, freed in this order
    # The five never-used blocks first (empty blocks always go before cached ones), then the last freed.
    assert [block.block_id for block in pool.get_new_blocks(7)] == [5, 6, 7, 8, 9, 4, 3]


def test_lfu_counts_hits_per_content_and_takes_the_least_recently_freed_among_equals():
    policy = LeastFrequentlyUsed()
    blocks = [KVCacheBlock(block_id) for block_id in range(4)]
    for block in blocks:
        block.block_hash = bytes([block.block_id])
    policy.record_hit(blocks[0])
    policy.record_hit(blocks[0])
    policy.record_hit(blocks[2])
    for block in (blocks[0], blocks[1], blocks[2], blocks[3]):
        policy.add(block)
    assert [block.block_id for block in policy] == [1, 3, 2, 0]
    policy.remove(blocks[3])  # revived by a hit: gone from the order, its stale heap entry skipped
    assert [policy.pop().block_id for _ in range(3)] == [1, 2, 0]
    assert len(policy) == 0
    blocks[0].block_hash = b"new content"  # cached again with other content: its hits start from 0
    policy.add(blocks[0])
    blocks[2].block_hash = bytes([2])
    policy.record_hit(blocks[2])
    policy.add(blocks[2])
    assert [block.block_id for block in policy] == [0, 2]


def test_lfu_heap_stays_bounded_under_churn():
    policy = LeastFrequentlyUsed()
    block = KVCacheBlock(7)
    block.block_hash = b"x"
    for _ in range(10_000):
        policy.add(block)
        policy.remove(block)
    assert len(policy._heap) <= 2 * len(policy) + 65


def test_restoring_the_free_order_keeps_cached_blocks_in_the_policy():
    pool = BlockPool(8, eviction_policy="lfu")
    blocks = pool.get_new_blocks(3)
    blocks[1].block_hash = b"cached"
    pool.cached_block_hash_to_block.insert(b"cached", blocks[1])
    pool.free_blocks(blocks)
    assert pool.restore_free_order()
    # Empty blocks in id order, then the cached one.
    assert [block.block_id for block in pool.free_block_queue] == [1, 3, 4, 5, 6, 7, 2]


@pytest.mark.parametrize("name, message", [
    ("mru", "one of 'lru', 'lfu', or 'module:Class'"),
    ("tests.core.no_such_module:Policy", "whose module imports"),
    ("tests.core.eviction_policy_examples:Missing", "has no callable 'Missing'"),
    ("tests.core.eviction_policy_examples:NotAPolicy", "whose instances are EvictionPolicy objects"),
])
def test_bad_policies_are_refused_by_field(name, message):
    with pytest.raises(ValueError, match=f"cache.eviction_policy must be .*{message}"):
        CacheConfig(eviction_policy=name)
