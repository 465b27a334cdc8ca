"""The free queue of a fresh pool holds its never-used blocks as a range, made on first use: it must behave exactly
as a queue built from every block does, while making only the blocks something asked for."""

from __future__ import annotations

import time
from itertools import islice

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.block_pool import BlockPool
from engine.core.free_block_queue import BlockStore, FreeKVCacheBlockQueue, KVCacheBlock

NUM_BLOCKS = 40

operations = st.lists(st.tuples(st.sampled_from(["take", "take", "free_front", "free_back", "remove", "peek"]),
                                st.integers(0, 1000)), max_size=80)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_a_lazy_queue_takes_and_orders_blocks_as_an_eager_one_does(ops):
    lazy = FreeKVCacheBlockQueue.fresh_range(BlockStore(NUM_BLOCKS), 1, NUM_BLOCKS)
    eager_blocks = [KVCacheBlock(block_id) for block_id in range(NUM_BLOCKS)]
    eager = FreeKVCacheBlockQueue(eager_blocks[1:])
    held_lazy: list[KVCacheBlock] = []  # blocks taken out, in the same order in both
    held_eager: list[KVCacheBlock] = []
    for op, pick in ops:
        if op == "take" and eager.num_free_blocks:
            count = 1 + pick % min(5, eager.num_free_blocks)
            held_lazy += lazy.popleft_n(count)
            held_eager += eager.popleft_n(count)
        elif op in ("free_front", "free_back") and held_eager:
            index = pick % len(held_eager)
            lazy_block, eager_block = held_lazy.pop(index), held_eager.pop(index)
            if op == "free_front":
                lazy.appendleft(lazy_block)
                eager.appendleft(eager_block)
            else:
                lazy.append(lazy_block)
                eager.append(eager_block)
        elif op == "remove":
            # Only a block that was freed can come back out of the middle (a prefix-cache hit): never a fresh one.
            linked = [block for block in eager if block.prev_free_block is not None]
            freed_before = {block.block_id for block in held_eager} | {block.block_id for block in linked}
            candidates = [block for block in lazy if block.prev_free_block is not None]
            if candidates:
                block = candidates[pick % len(candidates)]
                assert block.block_id in freed_before
                lazy.remove(block)
                eager.remove(eager_blocks[block.block_id])
                held_lazy.append(block)
                held_eager.append(eager_blocks[block.block_id])
        assert [block.block_id for block in lazy] == [block.block_id for block in eager]
        assert lazy.num_free_blocks == eager.num_free_blocks == len(list(eager))
        assert [block.block_id for block in held_lazy] == [block.block_id for block in held_eager]
        for block in held_lazy:
            assert not lazy.contains(block)
        for block in lazy:
            assert lazy.contains(block)


def test_a_huge_pool_costs_only_the_blocks_it_uses():
    started = time.perf_counter()
    pool = BlockPool(50_000_000)
    assert time.perf_counter() - started < 0.5  # an eager pool of 50M blocks takes minutes and ~6 GiB
    assert pool.blocks.num_made == 1  # the null block
    blocks = pool.get_new_blocks(3)
    assert [block.block_id for block in blocks] == [1, 2, 3] and pool.blocks.num_made == 4
    assert pool.get_num_free_blocks() == 50_000_000 - 1 - 3
    pool.free_blocks(reversed(blocks))
    # Freed unhashed blocks go to the front (as a group, in the call's order), ahead of the never-used ones.
    assert [block.block_id for block in pool.get_new_blocks(4)] == [3, 2, 1, 4]


def test_restoring_the_free_order_keeps_the_pool_lazy_when_nothing_is_cached():
    pool = BlockPool(1000, enable_caching=False)
    blocks = pool.get_new_blocks(10)
    pool.free_blocks(reversed(blocks))
    assert [block.block_id for block in islice(pool.free_block_queue, 3)] == [10, 9, 8]  # makes no more
    assert pool.restore_free_order()
    assert [block.block_id for block in pool.get_new_blocks(12)] == list(range(1, 13))
    assert pool.blocks.num_made == 13
