"""The pool of physical KV blocks: allocation, reference counts, and the prefix-cache hash map.

Invariants (checked by tests/core/helpers.py:check_kv_invariants after every rule of the KV-cache and
scheduler state machines):
- A block is in the free queue if and only if its ``ref_cnt`` is 0; the null block never is.
- ``cached_block_hash_to_block`` holds exactly the blocks with a hash, each under its own hash (several
  blocks may hold one content: engine/core/cached_block_map.py); a block evicted for reuse loses its hash.
- Free blocks + blocks in use = all blocks except the null block.
- ``num_shared_refs`` = sum over blocks other than the null block of max(ref_cnt - 1, 0): how many
  block-table entries point at a block another request holds too (after prefix-cache hits).
"""

from __future__ import annotations

from typing import Iterable

from engine.core.cached_block_map import CachedBlockMap
from engine.core.eviction_policies import make_eviction_policy
from engine.core.free_block_queue import BlockStore, FreeKVCacheBlockQueue, KVCacheBlock
from engine.core.policy_free_queue import PolicyFreeBlockQueue
from engine.core.kv_cache_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True, enable_kv_cache_events: bool = False,
                 eviction_policy: str = "lru") -> None:
        if num_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be at least 2 (one is the null block), got {num_blocks!r}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.enable_kv_cache_events = enable_kv_cache_events
        # Made on first use (free_block_queue.py): a large pool costs what its workload touches.
        self.blocks = BlockStore(num_blocks)
        self.free_block_queue = FreeKVCacheBlockQueue.fresh_range(self.blocks, 0, num_blocks)
        # Which free cached block is evicted first (engine/core/eviction_policies.py): None is vLLM's LRU, the
        # free queue's own order; a policy orders the cached blocks behind the empty ones.
        self.eviction_policy_name = eviction_policy
        self.eviction_policy = make_eviction_policy(eviction_policy)
        if self.eviction_policy is not None:
            self.free_block_queue = PolicyFreeBlockQueue(self.free_block_queue, self.eviction_policy)
        self.cached_block_hash_to_block = CachedBlockMap()
        # Kept exact in touch() and free_blocks(), the only places a held block's ref_cnt changes.
        self.num_shared_refs = 0
        # Block 0 is a placeholder that is never allocated: runners pad block tables with it.
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.events: list[KVCacheEvent] = []
        # Ids handed out since the scheduler last drained them; the runner zeroes these blocks so
        # that attention never reads stale values from a reused block.
        self.newly_allocated_block_ids: list[int] = []

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of usable blocks held by requests (cached-but-free blocks count as free)."""
        return 1.0 - self.free_block_queue.num_free_blocks / (self.num_blocks - 1)

    def get_cached_block(self, block_hash: bytes) -> KVCacheBlock | None:
        return self.cached_block_hash_to_block.get_one_block(block_hash)

    def get_new_blocks(self, count: int) -> list[KVCacheBlock]:
        """Take ``count`` blocks from the front of the free queue, evicting their cached content."""
        blocks = self.free_block_queue.popleft_n(count)
        for block in blocks:
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt = 1
        self.newly_allocated_block_ids.extend(block.block_id for block in blocks)
        return blocks

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-cache hits, reviving any that sat in the free queue."""
        free_block_queue = self.free_block_queue
        policy = self.eviction_policy
        for block in blocks:
            if policy is not None and not block.is_null:
                policy.record_hit(block)
            if block.ref_cnt == 0:
                free_block_queue.remove(block)
            elif not block.is_null:
                self.num_shared_refs += 1
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block, in eviction order (first freed = first evicted).

        A block without a hash holds nothing reusable, so it goes to the front of the queue. The
        unhashed blocks of one call go there as a group, in the call's order (the first of them is
        the next reused), as vLLM's ``prepend_n`` puts them: pushing them one by one would reverse
        them, and hand a request's freed blocks out again in the other order than vLLM does.
        """
        free_block_queue = self.free_block_queue
        unhashed: list[KVCacheBlock] = []
        for block in ordered_blocks:
            if block.ref_cnt > 1 and not block.is_null:
                self.num_shared_refs -= 1
            block.ref_cnt -= 1
            if block.ref_cnt == 0 and not block.is_null:
                if block.block_hash is None:
                    unhashed.append(block)
                else:
                    free_block_queue.append(block)
        for block in reversed(unhashed):
            free_block_queue.appendleft(block)

    def cache_full_blocks(self, block_hashes: list[bytes], blocks: list[KVCacheBlock], first: int, end: int,
                          token_ids: list[int], block_size: int) -> None:
        """Register blocks ``first..end-1`` of a request under their chained hashes.

        A block whose content another block holds already is registered too, as vLLM does: it stays
        cached when freed (LRU, behind the queue's unhashed blocks) and serves hits once the older copy
        is evicted. Blocks registered before (prefix-cache hits) are left as they are.
        """
        cached = self.cached_block_hash_to_block
        stored_run: list[bytes] = []
        run_start = first
        for index in range(first, end):
            block = blocks[index]
            block_hash = block_hashes[index]
            if block.block_hash is None:
                block.block_hash = block_hash
                cached.insert(block_hash, block)
                if self.enable_kv_cache_events:
                    if not stored_run:
                        run_start = index
                    stored_run.append(block_hash)
            elif stored_run:
                self._record_stored(stored_run, run_start, block_hashes, token_ids, block_size)
                stored_run = []
        if stored_run:
            self._record_stored(stored_run, run_start, block_hashes, token_ids, block_size)

    @property
    def all_blocks_free(self) -> bool:
        """No request holds a block: every usable block is in the free queue."""
        return self.free_block_queue.num_free_blocks == self.num_blocks - 1

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block. Refused (returns False) while any request holds blocks."""
        if not self.all_blocks_free:
            return False
        for block in self.cached_block_hash_to_block.blocks():
            block.block_hash = None
        self.cached_block_hash_to_block.clear()
        if self.enable_kv_cache_events:
            self.events.append(AllBlocksCleared())
        return True

    def restore_free_order(self) -> bool:
        """Put the free queue back in block-id order, as a fresh pool hands blocks out. Refused (returns
        False) while any request holds blocks.

        Which physical blocks a request gets decides how many runs of consecutive ids its block table
        has, and so how a CPU gathers its KV; a real run restores the order after its warm-up so that it
        starts where a simulated run of the same workload starts.
        """
        if not self.all_blocks_free:
            return False
        if not len(self.cached_block_hash_to_block):
            # Nothing a hit could revive from the middle: the never-used order, a fresh range again (whose blocks
            # are in no list: the made ones forget the old queue's links).
            for block in self.blocks.made():
                block.prev_free_block = block.next_free_block = None
            queue = FreeKVCacheBlockQueue.fresh_range(self.blocks, 1, self.num_blocks)
        else:  # block 0 is the null block
            queue = FreeKVCacheBlockQueue(self.blocks[block_id] for block_id in range(1, self.num_blocks)
                                          if self.eviction_policy is None or self.blocks[block_id].block_hash is None)
        if self.eviction_policy is not None:
            # The cached blocks in id order into a new policy (their hit counts start again).
            self.eviction_policy = make_eviction_policy(self.eviction_policy_name)
            queue = PolicyFreeBlockQueue(queue, self.eviction_policy,
                                         sorted((block for block in self.blocks.made() if block.block_hash is not None
                                                 and not block.is_null), key=lambda block: block.block_id))
        self.free_block_queue = queue
        return True

    def take_events(self) -> list[KVCacheEvent]:
        events, self.events = self.events, []
        return events

    def take_newly_allocated_block_ids(self) -> list[int]:
        block_ids, self.newly_allocated_block_ids = self.newly_allocated_block_ids, []
        return block_ids

    def uncache_block(self, block: KVCacheBlock) -> None:
        """Remove a block from the prefix cache (its content is not valid KV); the block stays held."""
        if block.block_hash is not None:
            self._evict(block)

    def _evict(self, block: KVCacheBlock) -> None:
        block_hash = block.block_hash
        self.cached_block_hash_to_block.pop(block_hash, block)
        block.block_hash = None
        if self.enable_kv_cache_events:
            self.events.append(BlockRemoved((block_hash,)))

    def _record_stored(self, stored: list[bytes], run_start: int, block_hashes: list[bytes],
                       token_ids: list[int], block_size: int) -> None:
        parent = block_hashes[run_start - 1] if run_start > 0 else None
        tokens = tuple(token_ids[run_start * block_size:(run_start + len(stored)) * block_size])
        self.events.append(BlockStored(tuple(stored), parent, tokens, block_size))
