"""Chunked local attention's KV-cache groups (Llama 4): blocks before a request's current chunk are handed back.

A chunked layer's query at position p reads the keys from ``p - p % chunk`` on (engine/core/kv_cache_manager.py).
The scheduler state machine draws chunked groups too (tests/core/test_scheduler_state_machine.py, whose executor
checks every key each query reads is still there); these pin what a chunk changes: where the first needed block
lies (not where a window of the same size puts it), how few blocks a long sequence holds, a prefix hit that starts
with null blocks, and the longest sequence the pool then serves.
"""

from __future__ import annotations

import pytest

from engine.core import CacheConfig, SchedulerConfig
from engine.core.block_hash import make_block_hasher
from engine.core.hybrid_kv_cache_manager import HybridKVCacheManager
from engine.core.kv_cache_manager import KVCacheManager
from tests.core.helpers import check_kv_invariants, make_core, make_request, run_to_completion

BLOCK_SIZE = 4
CHUNK = 16


def test_the_first_needed_block_is_the_start_of_the_earliest_querys_chunk():
    chunked = KVCacheManager(64, BLOCK_SIZE, 256, attention_chunk=CHUNK)
    windowed = KVCacheManager(64, BLOCK_SIZE, 256, sliding_window=CHUNK)
    # Position 31 is the last of chunk 1: its query reads keys 16..31 (blocks 4..7); a window of 16 reads the same.
    assert chunked.first_needed_block(31) == windowed.first_needed_block(31) == 4
    # Position 32 starts chunk 2: it reads only itself (block 8); the window still reaches back to key 17.
    assert chunked.first_needed_block(32) == 8 and windowed.first_needed_block(32) == 4
    assert [chunked.first_needed_block(position) for position in (0, 15, 16, 47, 48)] == [0, 0, 4, 8, 12]
    # A draft of 3 tokens may be taken back: the earliest query to run again is 3 earlier.
    rollback = KVCacheManager(64, BLOCK_SIZE, 256, attention_chunk=CHUNK, num_rollback_tokens=3)
    assert rollback.first_needed_block(34) == 4 and rollback.first_needed_block(35) == 8
    with pytest.raises(ValueError, match="attention_chunk"):
        KVCacheManager(64, BLOCK_SIZE, 256, attention_chunk=CHUNK, sliding_window=8)


def test_a_long_sequence_holds_a_chunks_blocks_in_the_chunked_group():
    # One full group and one chunked group; a 90-token prompt decoded 60 more tokens, one step each.
    core = make_core(num_gpu_blocks=200, block_size=BLOCK_SIZE, max_num_batched_tokens=32,
                     kv_cache_groups=(None, CHUNK), chunked_groups=True)
    manager = core.scheduler.kv_cache_manager
    full, chunked = manager.groups
    assert chunked.attention_chunk == CHUNK and chunked.sliding_window is None and full.attention_chunk is None
    core.add_request(make_request("long", list(range(1000, 1090)), max_tokens=60, ignore_eos=True))
    most_real = most_skipped = 0
    while core.has_work():
        core.step()
        check_kv_invariants(manager)
        blocks = chunked.req_to_blocks.get("long")
        if blocks:
            most_real = max(most_real, sum(1 for block in blocks if not block.is_null))
            most_skipped = max(most_skipped, chunked.num_skipped_block["long"])
            assert len(full.req_to_blocks["long"]) == len(blocks) and not any(
                block.is_null for block in full.req_to_blocks["long"])
    # A 32-token prefill chunk plus the chunk's own 16 keys: at most (16 - 1 + 32) // 4 + 2 = 13 blocks at once,
    # where the full group held 38 at the end. Handed back as the chunks pass: the last schedule saw 149 computed
    # tokens (chunk 9 starts at 144, block 36); a step earlier at least chunk 8's start (128, block 32).
    assert most_real <= (CHUNK - 1 + 32) // BLOCK_SIZE + 2
    assert most_skipped >= 32
    assert manager.num_free_blocks == manager.num_usable_blocks


def test_a_prefix_hit_of_a_chunked_group_needs_only_the_last_chunks_blocks():
    manager = HybridKVCacheManager(64, BLOCK_SIZE, 256, (None, CHUNK), chunked_groups=True)
    prompt = list(range(100, 141))  # 10 full blocks and one token
    first = make_request("first", prompt, max_tokens=4)
    first.set_block_hasher(make_block_hasher(BLOCK_SIZE))
    assert manager.allocate_slots(first, len(prompt)) is not None
    first.num_computed_tokens = len(prompt)
    manager.free(first)
    # The chunked group's blocks of chunk 0 leave the cache: a hit of 10 blocks (the query at 40 is in chunk 2,
    # from block 8) does not need them, so it still holds; the full group still has every block.
    full, chunked = manager.groups
    for block_hash in first.block_hashes[:4]:
        manager.block_pool.uncache_block(manager.block_pool.get_cached_block(block_hash + chunked.hash_tag))
    second = make_request("second", prompt, max_tokens=4)
    second.set_block_hasher(make_block_hasher(BLOCK_SIZE))
    (full_hit, chunked_hit), num_hit_tokens = manager.get_computed_blocks(second)
    assert num_hit_tokens == 40 and len(full_hit) == len(chunked_hit) == 10
    assert all(block.is_null for block in chunked_hit[:8]) and not any(block.is_null for block in chunked_hit[8:])
    assert not any(block.is_null for block in full_hit)
    assert manager.allocate_slots(second, 1, num_hit_tokens, (full_hit, chunked_hit)) is not None
    second.num_computed_tokens = len(prompt)
    check_kv_invariants(manager)
    # Chunk 1's blocks (4..7) gone too: the hit still holds, its first query (position 40) reading blocks 8.. only.
    manager.free(second)
    for block_hash in first.block_hashes[4:8]:
        block = manager.block_pool.get_cached_block(block_hash + chunked.hash_tag)
        if block is not None:
            manager.block_pool.uncache_block(block)
    third = make_request("third", prompt, max_tokens=4)
    third.set_block_hasher(make_block_hasher(BLOCK_SIZE))
    _, num_hit_tokens = manager.get_computed_blocks(third)
    assert num_hit_tokens == 40


def test_a_chunked_model_serves_sequences_longer_than_its_pool_holds_in_every_group():
    # 40 usable blocks over two groups: kept whole, a sequence fits 20 blocks (80 tokens); with the chunked group
    # handing back, the full group may take nearly all of them.
    config = CacheConfig(block_size=BLOCK_SIZE, num_gpu_blocks=41, kv_cache_groups=(None, CHUNK),
                         attention_chunk_size=CHUNK, attention_chunk_fraction=0.5)
    scheduler_config = SchedulerConfig(max_num_batched_tokens=8, max_model_len=1000)
    max_len = scheduler_config.effective_max_model_len(config)
    assert max_len == (40 - ((CHUNK - 1 + 8) // BLOCK_SIZE + 2)) * BLOCK_SIZE > 80
    core = make_core(num_gpu_blocks=41, block_size=BLOCK_SIZE, max_num_batched_tokens=8, max_model_len=1000,
                     kv_cache_groups=(None, CHUNK), chunked_groups=True)
    core.add_request(make_request("long", list(range(2000, 2000 + max_len - 4)), max_tokens=4, ignore_eos=True))
    finished = run_to_completion(core)
    assert len(finished["long"]["tokens"]) == 4 and finished["long"]["finish_reason"] == "length"
    assert core.scheduler.num_preemptions_total == 0


def test_a_chunked_configs_groups_must_be_its_chunk():
    with pytest.raises(ValueError, match="kv_cache_groups"):
        CacheConfig(kv_cache_groups=(None, 8), attention_chunk_size=16)
    assert CacheConfig(kv_cache_groups=(None, 16, 16), attention_chunk_size=16).kv_cache_groups == (None, 16, 16)
