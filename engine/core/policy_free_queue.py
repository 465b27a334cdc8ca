"""The free queue when an eviction policy other than vLLM's LRU orders the cached blocks
(engine/core/eviction_policies.py).

Two parts, taken in this order: the empty blocks (never used, or freed without a hash), in the order the LRU queue
keeps them (a ``FreeKVCacheBlockQueue``: the fresh range, blocks freed unhashed pushed to its front); then the free
blocks that hold a hash, in the policy's order. This is the LRU queue's shape with its cached tail reordered: the
LRU queue takes every empty block before any cached one too, since cached blocks are appended behind the rest.

The same interface as ``FreeKVCacheBlockQueue``; ``append`` takes a block with a hash to the policy (the pool
appends only those: engine/core/block_pool.py), one without to the empty part's end.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from engine.core.eviction_policies import EvictionPolicy
from engine.core.free_block_queue import FreeKVCacheBlockQueue, KVCacheBlock


class PolicyFreeBlockQueue:
    __slots__ = ("empty", "policy")

    def __init__(self, empty: FreeKVCacheBlockQueue, policy: EvictionPolicy,
                 blocks: Iterable[KVCacheBlock] = ()) -> None:
        self.empty = empty
        self.policy = policy
        for block in blocks:
            self.append(block)

    @property
    def num_free_blocks(self) -> int:
        return self.empty.num_free_blocks + len(self.policy)

    def popleft(self) -> KVCacheBlock:
        return self.popleft_n(1)[0]

    def popleft_n(self, count: int) -> list[KVCacheBlock]:
        if count > self.num_free_blocks:
            raise ValueError(f"asked for {count} free blocks, only {self.num_free_blocks} left")
        from_empty = min(count, self.empty.num_free_blocks)
        taken = self.empty.popleft_n(from_empty) if from_empty else []
        pop = self.policy.pop
        taken += [pop() for _ in range(count - from_empty)]
        return taken

    def remove(self, block: KVCacheBlock) -> None:
        if self.policy.contains(block):
            self.policy.remove(block)
        else:
            self.empty.remove(block)

    def append(self, block: KVCacheBlock) -> None:
        if block.block_hash is not None:
            self.policy.add(block)
        else:
            self.empty.append(block)

    def appendleft(self, block: KVCacheBlock) -> None:
        self.empty.appendleft(block)

    def contains(self, block: KVCacheBlock) -> bool:
        return self.policy.contains(block) or self.empty.contains(block)

    def __iter__(self) -> Iterator[KVCacheBlock]:
        yield from self.empty
        yield from self.policy

    def __len__(self) -> int:
        return self.num_free_blocks
