"""Which cached block the prefix cache gives up first: vLLM's LRU, least-frequently-used, or a policy of your own.

A free block that holds a hash is a prefix-cache entry no request uses; when the pool needs a block and none is
empty, one such entry is evicted. vLLM evicts the least recently freed (a request's blocks freed tail first, so
its last blocks go before its first): the free queue's order (engine/core/free_block_queue.py), the default
(``"lru"``). A policy here replaces that order for the cached blocks only; empty blocks (never used, or freed
without a hash) are always taken first, in the queue's order, as before.

- ``"lfu"``: the entry with the fewest prefix-cache hits since it was cached goes first; among equals, the least
  recently freed. A scan of one-off long prompts then cannot flush a popular system prompt that LRU would drop.
- ``"module:Class"``: ``Class()`` is an ``EvictionPolicy`` (below): told when a cached block becomes free (``add``),
  is revived by a hit (``remove``) or is hit at all (``record_hit``), it answers which free cached block goes next
  (``pop``), and lists them in that order (``__iter__``, for tests and tools). Blocks are the pool's
  ``KVCacheBlock``s: ``block_id``, ``block_hash`` (bytes; equal hashes hold equal prefixes), ``ref_cnt``.

Invariant (tests/core/test_eviction_policies.py, and the scheduler state machines, which draw ``"lfu"``): a policy
holds exactly the free blocks that have a hash and were added after they last held one, each once.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Iterator, Protocol, runtime_checkable

from engine.core.free_block_queue import KVCacheBlock
from engine.core.named_import import import_named_callable

NAMED_EVICTION_POLICIES = ("lru", "lfu")


@runtime_checkable
class EvictionPolicy(Protocol):
    def add(self, block: KVCacheBlock) -> None:
        """A block with a hash became free: it may be evicted from now on."""

    def remove(self, block: KVCacheBlock) -> None:
        """A free block it holds leaves (a prefix-cache hit revives it)."""

    def pop(self) -> KVCacheBlock:
        """The free cached block to evict now (it leaves the policy)."""

    def record_hit(self, block: KVCacheBlock) -> None:
        """A prefix-cache hit on ``block`` (free or in use), before it is revived."""

    def contains(self, block: KVCacheBlock) -> bool: ...

    def __iter__(self) -> Iterator[KVCacheBlock]:
        """The blocks in the order ``pop`` would take them."""

    def __len__(self) -> int: ...


class LeastFrequentlyUsed:
    """Evict the free cached block with the fewest hits since it was cached, the least recently freed first
    among equals. A heap of (hits, order freed, block) with lazy deletion: a revived block's entry stays in the
    heap and is skipped when popped (it is no longer the block's live entry); the heap is rebuilt from the live
    entries when the stale ones outnumber them."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, KVCacheBlock]] = []
        self._live: dict[int, tuple[int, int, KVCacheBlock]] = {}  # block id -> its entry in the heap
        self._hits: dict[int, tuple[bytes, int]] = {}  # block id -> (the hash its count is for, hits)
        self._sequence = itertools.count()

    def _hits_of(self, block: KVCacheBlock) -> int:
        counted = self._hits.get(block.block_id)
        return counted[1] if counted is not None and counted[0] == block.block_hash else 0

    def record_hit(self, block: KVCacheBlock) -> None:
        # Counted for the block's current content only: a block cached again later starts from 0.
        self._hits[block.block_id] = (block.block_hash, self._hits_of(block) + 1)

    def add(self, block: KVCacheBlock) -> None:
        entry = (self._hits_of(block), next(self._sequence), block)
        self._live[block.block_id] = entry
        heapq.heappush(self._heap, entry)
        if len(self._heap) > 2 * len(self._live) + 64:
            self._heap = list(self._live.values())
            heapq.heapify(self._heap)

    def remove(self, block: KVCacheBlock) -> None:
        del self._live[block.block_id]

    def pop(self) -> KVCacheBlock:
        heap, live = self._heap, self._live
        while heap:
            entry = heapq.heappop(heap)
            block = entry[2]
            if live.get(block.block_id) is entry:
                del live[block.block_id]
                self._hits.pop(block.block_id, None)
                return block
        raise ValueError("no free cached blocks left")

    def contains(self, block: KVCacheBlock) -> bool:
        return block.block_id in self._live

    def __iter__(self) -> Iterator[KVCacheBlock]:
        return iter([entry[2] for entry in sorted(self._live.values(), key=lambda entry: entry[:2])])

    def __len__(self) -> int:
        return len(self._live)


def check_eviction_policy(name: str) -> None:
    """ValueError (the requirement, for the config to name the field) unless ``name`` is a named policy or a
    ``module:Class`` that imports and builds an EvictionPolicy."""
    make_eviction_policy(name)


def make_eviction_policy(name: str) -> EvictionPolicy | None:
    """None for ``"lru"`` (the free queue's own order), else the policy ``name`` names."""
    if name == "lru":
        return None
    if name == "lfu":
        return LeastFrequentlyUsed()
    factory = import_named_callable(name, "Class", f"one of {', '.join(map(repr, NAMED_EVICTION_POLICIES))}, or "
                                    "'module:Class' naming an EvictionPolicy")
    policy = factory()
    if not isinstance(policy, EvictionPolicy):
        raise ValueError(f"'module:Class' whose instances are EvictionPolicy objects (add, remove, pop, record_hit, "
                         f"contains, __iter__, __len__); {name} is not one")
    return policy
