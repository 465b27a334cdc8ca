"""Examples that pin vLLM-compatible behaviour of the block pool and the KV-cache manager."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.core import AllBlocksCleared, BlockRemoved, BlockStored, Request, SamplingParams
from engine.core.block_hash import hash_request_blocks, make_block_hasher
from engine.core.kv_cache_manager import KVCacheManager

from tests.core.helpers import check_kv_invariants

BLOCK_SIZE = 16


def manager(num_blocks=10, caching=True, events=False) -> KVCacheManager:
    return KVCacheManager(num_blocks, BLOCK_SIZE, max_model_len=4096, enable_caching=caching,
                          enable_kv_cache_events=events)


def request(request_id, tokens, **kwargs) -> Request:
    return Request(request_id, list(tokens), SamplingParams(max_tokens=8, **kwargs),
                   block_hasher=make_block_hasher(BLOCK_SIZE))


def admit(kv: KVCacheManager, req: Request, num_new_tokens=None):
    hits, num_hits = kv.get_computed_blocks(req)
    num_new_tokens = num_new_tokens or req.num_tokens - num_hits
    new_blocks = kv.allocate_slots(req, num_new_tokens, num_hits, hits)
    if new_blocks is not None:
        req.num_computed_tokens = num_hits + num_new_tokens
    return new_blocks, num_hits


def free_order(kv: KVCacheManager) -> list[int]:
    return [block.block_id for block in kv.block_pool.free_block_queue]


def test_free_queue_order_after_frees_is_lru_tail_first_with_unhashed_blocks_in_front():
    kv = manager(num_blocks=10)
    assert free_order(kv) == [1, 2, 3, 4, 5, 6, 7, 8, 9]  # block 0 is the null block
    a = request("a", range(40))          # 2 full blocks + a partial one
    b = request("b", range(100, 132))    # 2 full blocks
    admit(kv, a)
    admit(kv, b)
    assert kv.get_block_ids("a") == [1, 2, 3] and kv.get_block_ids("b") == [4, 5]
    assert free_order(kv) == [6, 7, 8, 9]
    kv.free(a)
    # Tail first: the partial block 3 (no hash) goes to the front, then 2 and 1 to the back.
    assert free_order(kv) == [3, 6, 7, 8, 9, 2, 1]
    kv.free(b)
    assert free_order(kv) == [3, 6, 7, 8, 9, 2, 1, 5, 4]
    check_kv_invariants(kv)
    # The next allocation takes the front: the unhashed block, then never-used ones.
    c = request("c", range(500, 520))
    admit(kv, c)
    assert kv.get_block_ids("c") == [3, 6]


def test_unhashed_blocks_freed_together_keep_the_freeing_order_at_the_front():
    # Without prefix caching no block has a hash: vLLM's free_blocks puts a finished request's blocks
    # at the front of the queue in the order they are freed (prepend_n), tail first, so the next
    # request reuses the tail block first. Pushing them one by one would hand out 1, 2, 3 instead.
    kv = manager(num_blocks=10, caching=False)
    a = request("a", range(40))
    admit(kv, a)
    assert kv.get_block_ids("a") == [1, 2, 3]
    kv.free(a)
    assert free_order(kv) == [3, 2, 1, 4, 5, 6, 7, 8, 9]
    b = request("b", range(100, 130))
    admit(kv, b)
    kv.free(b)  # a later group goes in front of an earlier one
    assert free_order(kv) == [2, 3, 1, 4, 5, 6, 7, 8, 9]
    check_kv_invariants(kv)


def test_fully_cached_48_token_prompt_hits_32_tokens():
    kv = manager(num_blocks=20)
    first = request("first", range(48))
    admit(kv, first)
    kv.free(first)
    again = request("again", range(48))
    hits, num_hits = kv.get_computed_blocks(again)
    # The last token must be computed, so the third full block cannot be a hit.
    assert num_hits == 32
    assert [block.block_hash for block in hits] == again.block_hashes[:2]


def test_hit_revives_blocks_from_the_free_queue_and_takes_references():
    kv = manager(num_blocks=20)
    first = request("first", range(48))
    admit(kv, first)
    second = request("second", list(range(32)) + [999] * 10)
    _, num_hits = admit(kv, second)
    assert num_hits == 32
    first_ids, second_ids = kv.get_block_ids("first"), kv.get_block_ids("second")
    assert first_ids[:2] == second_ids[:2]
    assert [kv.block_pool.blocks[i].ref_cnt for i in first_ids[:2]] == [2, 2]
    kv.free(first)
    kv.free(second)
    check_kv_invariants(kv)


def test_failed_allocation_changes_nothing():
    kv = manager(num_blocks=6)  # 5 usable blocks
    holder = request("holder", range(48))
    admit(kv, holder)  # 3 blocks
    kv.free(holder)
    holder2 = request("holder2", range(1000, 1016))
    admit(kv, holder2)  # takes one block from the front of the queue
    before_refs = [block.ref_cnt for block in kv.block_pool.blocks]
    before_order = free_order(kv)
    before_tables = {rid: kv.get_block_ids(rid) for rid in kv.req_to_blocks}
    before_cached = kv.block_pool.cached_block_hash_to_block.block_ids()
    # A prefix hit of 2 blocks plus 3 new blocks needs 5, only 4 are free.
    big = request("big", list(range(32)) + list(range(2000, 2040)))
    assert admit(kv, big)[0] is None
    assert [block.ref_cnt for block in kv.block_pool.blocks] == before_refs
    assert free_order(kv) == before_order
    assert {rid: kv.get_block_ids(rid) for rid in kv.req_to_blocks} == before_tables
    assert kv.block_pool.cached_block_hash_to_block.block_ids() == before_cached
    assert "big" not in kv.req_to_blocks
    check_kv_invariants(kv)


def test_evicted_block_loses_its_hash_and_events_report_it():
    kv = manager(num_blocks=4, events=True)  # 3 usable blocks
    a = request("a", range(32))
    admit(kv, a)
    stored = kv.take_events()
    assert stored == [BlockStored(tuple(a.block_hashes), None, tuple(range(32)), BLOCK_SIZE)]
    kv.free(a)
    b = request("b", range(100, 148))  # needs all 3 blocks: evicts both cached ones
    admit(kv, b)
    events = kv.take_events()
    removed = [event for event in events if isinstance(event, BlockRemoved)]
    assert {event.block_hashes[0] for event in removed} == set(a.block_hashes)
    assert not kv.block_pool.cached_block_hash_to_block.hashes() & set(a.block_hashes)
    assert kv.get_computed_blocks(request("a2", range(32)))[1] == 0
    check_kv_invariants(kv)


def test_reset_prefix_cache_refused_while_blocks_are_held():
    kv = manager(num_blocks=10, events=True)
    a = request("a", range(40))
    admit(kv, a)
    assert kv.reset_prefix_cache() is False
    kv.free(a)
    kv.take_events()
    assert kv.reset_prefix_cache() is True
    assert kv.take_events() == [AllBlocksCleared()]
    assert not kv.block_pool.cached_block_hash_to_block
    assert all(block.block_hash is None for block in kv.block_pool.blocks)
    check_kv_invariants(kv)


def test_cache_salt_separates_identical_prompts():
    salted = hash_request_blocks(list(range(32)), BLOCK_SIZE, cache_salt="tenant-a")
    plain = hash_request_blocks(list(range(32)), BLOCK_SIZE)
    assert salted[0] != plain[0] and salted[1] != plain[1]
    kv = manager(num_blocks=20)
    admit(kv, request("a", range(48)))
    other = Request("b", list(range(48)), SamplingParams(), cache_salt="tenant-b",
                    block_hasher=make_block_hasher(BLOCK_SIZE))
    assert kv.get_computed_blocks(other)[1] == 0


def test_block_hashes_are_identical_across_processes():
    code = ("from engine.core.block_hash import hash_request_blocks;"
            "print([h.hex() for h in hash_request_blocks(list(range(64)), 16, cache_salt='s')])")
    outputs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={"PYTHONHASHSEED": str(seed)}).stdout for seed in (1, 2)}
    assert len(outputs) == 1
    assert outputs.pop().strip() == str([h.hex() for h in hash_request_blocks(list(range(64)), 16, cache_salt="s")])


def test_prefix_stats_count_recomputation_after_preemption_apart():
    kv = manager(num_blocks=20)
    a = request("a", range(48))
    admit(kv, a)
    kv.record_prefix_cache_query(a, 0)
    b = request("b", range(48))
    hits, num_hits = kv.get_computed_blocks(b)
    kv.record_prefix_cache_query(b, num_hits)
    b.num_preemptions = 1
    kv.record_prefix_cache_query(b, num_hits)
    stats = kv.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (2, 96, 32)
    assert (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == (1, 48, 32)
    assert stats.hit_rate == pytest.approx(32 / 96)
    assert kv.make_prefix_cache_stats().queries == 0


def test_prompt_logprobs_requests_skip_the_cache_and_caching_off_never_hits():
    kv = manager(num_blocks=20)
    admit(kv, request("a", range(48)))
    assert kv.get_computed_blocks(request("b", range(48), prompt_logprobs=1))[1] == 0
    plain = manager(num_blocks=20, caching=False)
    admit(plain, request("a", range(48)))
    assert plain.get_computed_blocks(request("b", range(48)))[1] == 0
    assert not plain.block_pool.cached_block_hash_to_block


def test_decode_allocates_a_block_only_when_the_last_one_fills():
    kv = manager(num_blocks=10)
    a = request("a", range(16))
    admit(kv, a)
    assert len(kv.get_block_ids("a")) == 1
    a.append_output_token_ids(5)
    assert len(kv.allocate_slots(a, 1)) == 1  # token 17 needs a second block
    a.num_computed_tokens += 1
    for step in range(15):
        a.append_output_token_ids(step)
        assert kv.allocate_slots(a, 1) == []
        a.num_computed_tokens += 1
    # The second block filled: it is now cached under the request's second hash.
    assert len(a.block_hashes) == 2
    assert kv.block_pool.get_cached_block(a.block_hashes[1]).block_id == kv.get_block_ids("a")[1]
    check_kv_invariants(kv)


def test_num_gpu_blocks_must_leave_room_beside_the_null_block():
    with pytest.raises(ValueError, match="num_gpu_blocks"):
        manager(num_blocks=1)


def test_copies_of_cached_content_are_cached_too_and_serve_hits_after_the_first_is_evicted():
    # Two requests prefill the same 32-token prefix side by side (both admitted before either is cached):
    # each holds its own copy. As in vLLM's block pool both copies are registered (and reported), both
    # go to the LRU tail when freed, and a lookup finds the oldest copy; once that one is evicted for
    # reuse, the other still serves the hit.
    kv = manager(num_blocks=12, events=True)  # 11 usable blocks
    a, b = request("a", range(40)), request("b", range(40))
    for req in (a, b):
        assert kv.allocate_slots(req, 40) is not None  # no lookup: neither is cached yet
    for req in (a, b):
        req.num_computed_tokens = 40
        kv.allocate_slots(req, 1)  # the next step caches the full blocks
    assert kv.get_block_ids("a")[:2] == [1, 2] and kv.get_block_ids("b")[:2] == [4, 5]
    cached = kv.block_pool.cached_block_hash_to_block.block_ids()
    assert [cached[block_hash] for block_hash in a.block_hashes] == [(1, 4), (2, 5)]
    stored = [event for event in kv.take_events() if isinstance(event, BlockStored)]
    assert [event.block_hashes for event in stored] == [tuple(a.block_hashes)] * 2
    kv.free(a)
    kv.free(b)
    check_kv_invariants(kv)
    # Unhashed partial tails first, then a's copies (tail first), then b's.
    assert free_order(kv) == [6, 3, 7, 8, 9, 10, 11, 2, 1, 5, 4]
    assert [block.block_id for block in kv.get_computed_blocks(request("c", range(40)))[0]] == [1, 2]
    # Nine blocks in use evict a's copies (2 and 1 come off the queue after the other seven) ...
    filler = request("filler", range(1000, 1000 + 9 * 16))
    admit(kv, filler)
    assert {2, 1} <= set(kv.get_block_ids("filler"))
    # ... and b's copies still serve the prefix.
    hits, num_hits = kv.get_computed_blocks(request("d", range(40)))
    assert num_hits == 32 and [block.block_id for block in hits] == [4, 5]
    check_kv_invariants(kv)


def test_a_request_whose_window_handed_back_every_block_holds_none():
    # Window 1: a query reads only itself. After two blocks computed, a chunk too large for the pool first hands
    # back every block before it, then fails: the live request holds only null entries, and the pool, every block
    # free, may be reset (the KV state machine found this: a live request no longer means blocks in use).
    manager = KVCacheManager(4, 2, max_model_len=10_000, sliding_window=1)
    request = Request("r", list(range(100, 111)), SamplingParams(), block_hasher=make_block_hasher(2))
    assert manager.allocate_slots(request, 4) is not None
    request.num_computed_tokens = 4
    assert manager.allocate_slots(request, 7) is None
    assert all(block.is_null for block in manager.get_blocks("r"))
    assert manager.num_free_blocks == manager.num_usable_blocks
    assert manager.block_pool.restore_free_order() and manager.reset_prefix_cache()
