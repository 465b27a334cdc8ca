"""The hybrid KV cache (engine/core/hybrid_kv_cache_manager.py) on cases built to break it.

The scheduler state machine draws hybrid caches too (tests/core/test_scheduler_state_machine.py); these pin the
cases random traffic seldom builds: groups that disagree on a hit, an allocation one group of which would not
fit, hits of two groups sitting in the free queue while new blocks are taken, and the longest sequence the pool
holds across groups.
"""

from __future__ import annotations

import pytest

from engine.core import CacheConfig, SchedulerConfig
from engine.core.block_hash import make_block_hasher
from engine.core.config import hybrid_capacity_tokens
from engine.core.hybrid_kv_cache_manager import HybridKVCacheManager
from engine.core.kv_cache_grouping import group_layers
from tests.core.helpers import check_kv_invariants, make_core, make_request, run_to_completion

BLOCK_SIZE = 4


def hashed_request(request_id: str, prompt: list[int]):
    request = make_request(request_id, prompt, max_tokens=4)
    request.set_block_hasher(make_block_hasher(BLOCK_SIZE))
    return request


def computed(manager: HybridKVCacheManager, request, num_tokens: int) -> None:
    """Allocate and compute ``num_tokens`` of the request's prompt in one step."""
    assert manager.allocate_slots(request, num_tokens) is not None
    request.num_computed_tokens += num_tokens


def test_groups_agree_on_one_hit_that_every_window_can_read():
    window = 6
    manager = HybridKVCacheManager(64, BLOCK_SIZE, 256, (window, None))
    prompt = list(range(100, 133))  # 8 full blocks and one token
    first = hashed_request("first", prompt)
    computed(manager, first, len(prompt))
    manager.free(first)
    # The full group loses its blocks 4.. (evicted); the windowed group keeps its last ones.
    windowed, full = manager.groups
    full_blocks = [manager.block_pool.get_cached_block(block_hash + full.hash_tag) for block_hash in first.block_hashes]
    assert all(block is not None for block in full_blocks)
    for block in full_blocks[4:]:
        manager.block_pool.uncache_block(block)
    second = hashed_request("second", prompt)
    hits, num_hit_tokens = manager.get_computed_blocks(second)
    assert num_hit_tokens == 4 * BLOCK_SIZE
    windowed_hit, full_hit = hits
    assert len(windowed_hit) == len(full_hit) == 4
    # The window of the first token to compute (position 16) reaches back to position 11, in block 2.
    first_key = num_hit_tokens - window + 1
    assert all(not block.is_null for block in windowed_hit[first_key // BLOCK_SIZE:])
    assert manager.allocate_slots(second, len(prompt) - num_hit_tokens, num_hit_tokens, hits) is not None
    check_kv_invariants(manager)


def test_an_allocation_one_group_cannot_hold_changes_nothing():
    manager = HybridKVCacheManager(12, BLOCK_SIZE, 256, (None, None, 8))
    request = hashed_request("big", list(range(200, 216)))  # 4 blocks a group: 12 > 11 usable
    assert manager.allocate_slots(request, 16) is None
    assert manager.num_free_blocks == manager.num_usable_blocks
    assert all("big" not in group.req_to_blocks for group in manager.groups)
    assert manager.allocate_slots(request, 12) is not None  # 3 blocks a group: 9 fit
    check_kv_invariants(manager)


def test_new_blocks_never_evict_another_groups_hit():
    # A pool every block of which is cached, the free queue holding group 0's blocks of a prompt, then group 1's,
    # then another request's. A request hitting the prompt in both groups needs one new block per group: the
    # pool has exactly enough, but only if every group's hits leave the queue before any new block is taken
    # (else group 0's new block is the front of the queue, a block group 1 is about to hit).
    prompt = list(range(300, 316))  # 4 full blocks a group
    manager = HybridKVCacheManager(11, BLOCK_SIZE, 256, (None, None))
    first, other = hashed_request("first", prompt), hashed_request("other", [1, 2, 3, 4])
    computed(manager, first, 16)
    computed(manager, other, 4)
    assert manager.num_free_blocks == 0
    manager.free(first)
    manager.free(other)
    second = hashed_request("second", prompt + [7, 8, 9, 10])
    hits, num_hit_tokens = manager.get_computed_blocks(second)
    assert num_hit_tokens == 16
    hit_ids = [[block.block_id for block in group] for group in hits]
    assert manager.allocate_slots(second, 4, num_hit_tokens, hits) is not None
    manager.record_prefix_cache_query(second, num_hit_tokens)
    stats = manager.make_prefix_cache_stats()  # one lookup, counted once for every group
    assert (stats.queries, stats.hits) == (20, 16)
    for group, table in enumerate(manager.get_block_ids("second")):
        assert table[:4] == hit_ids[group]
        assert all(manager.block_pool.blocks[block_id].block_hash is not None for block_id in table[:4])
    check_kv_invariants(manager)


def test_the_longest_sequence_fits_every_group_at_once():
    cache = CacheConfig(block_size=BLOCK_SIZE, num_gpu_blocks=101, kv_cache_groups=(None, 8, 8, 8))
    capacity = hybrid_capacity_tokens(cache, max_step_tokens=16, num_rollback_tokens=0)
    # Each windowed group holds at most (8 - 1 + 16) // 4 + 2 = 7 blocks; the full group the rest: 100 - 21.
    assert capacity == (100 - 3 * 7) * BLOCK_SIZE
    scheduler_config = SchedulerConfig(max_num_batched_tokens=16, max_model_len=100_000)
    assert scheduler_config.effective_max_model_len(cache) == capacity
    # A request that long runs to the end alone, its windowed groups handing blocks back as it goes.
    core = make_core(num_gpu_blocks=101, block_size=BLOCK_SIZE, max_num_batched_tokens=16, max_model_len=100_000,
                     kv_cache_groups=(None, 8, 8, 8))
    core.add_request(make_request("long", list(range(capacity - 8)), max_tokens=8))
    results = run_to_completion(core)
    assert results["long"]["finish_reason"] == "length" and len(results["long"]["tokens"]) == 8
    too_long = make_request("too-long", list(range(capacity + 1)), max_tokens=1)
    core.add_request(too_long)
    assert run_to_completion(core)["too-long"]["finish_reason"] == "ignored"


def test_kv_transfer_is_refused_by_name():
    core = make_core(kv_cache_groups=(None, 8))
    with pytest.raises(ValueError, match="hybrid KV cache"):
        core.add_request(make_request("remote", [1, 2, 3], do_remote_prefill=True))


@pytest.mark.parametrize("groups", [(None,), (None, 0), (None, True), (None, 2.5), "ab"])
def test_bad_groups_are_named(groups):
    with pytest.raises(ValueError, match="kv_cache_groups"):
        CacheConfig(kv_cache_groups=groups)


def test_offloading_is_refused_with_groups():
    with pytest.raises(ValueError, match="num_offload_blocks"):
        CacheConfig(kv_cache_groups=(None, 8), num_offload_blocks=4)


def test_groups_read_back_from_a_summary():
    assert CacheConfig(kv_cache_groups=[None, 8]).kv_cache_groups == (None, 8)  # JSON has lists


def test_layers_group_by_kind_in_model_order():
    # Gemma 3's pattern: five local layers, then a global one.
    windows = [512 if (layer + 1) % 6 else None for layer in range(26)]
    grouping = group_layers(windows)
    assert grouping.windows == (None,) + (512,) * 6 and grouping.layers_per_block == 4
    assert grouping.layers[0] == (5, 11, 17, 23)
    assert grouping.layers[1] == (0, 1, 2, 3) and grouping.layers[-1] == (24, 25)  # the last local group is short
    assert grouping.group_and_slot(11) == (0, 1) and grouping.group_and_slot(25) == (6, 1)
    # Two windows are two kinds; all full or all windowed is no hybrid cache.
    assert group_layers([None, 8, 16, None, 8, 16]).windows == (None, 8, 16)
    assert group_layers([None] * 4) is None and group_layers([8] * 4) is None
