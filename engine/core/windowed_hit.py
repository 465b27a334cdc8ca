"""The longest prefix-cache hit of a KV-cache table that hands back its leading blocks (a sliding window, or a
chunked group's chunks: engine/core/kv_cache_manager.py).

A hit of ``n`` blocks needs only its last blocks, those the window (or chunk) of the first token to compute
(position ``n * block_size``) reaches; the blocks before them need not be cached (they would be handed back at
once), and the hit holds the null block there. With a window, the blocks of a finished request leave the cache
oldest first, so a prefix is often still usable when its first blocks are gone.

Searched from the longest candidate down: when a needed block ``m`` is missing, every candidate from ``m + 1`` to
``n`` needs it too (the first needed block never moves back as ``n`` shrinks), so the next candidate is ``m``. Each
hash is looked up once; a waiting request retried at every step costs a set-membership pass over its hashes, not a
Python call per block.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.core.block_pool import BlockPool
from engine.core.free_block_queue import KVCacheBlock

_NO_BLOCKS: list[KVCacheBlock] = []


def windowed_hit(block_hashes, block_pool: BlockPool, block_size: int,
                 first_needed_block: Callable[[int], int]) -> tuple[list[KVCacheBlock], int]:
    """The hit's blocks (null ones first) and its length in tokens; ``first_needed_block(position)``: the first
    block the query at ``position`` may read (KVCacheManager.first_needed_block)."""
    cached = block_pool.cached_block_hash_to_block
    present = [block_hash in cached for block_hash in block_hashes]
    if not any(present):
        return _NO_BLOCKS, 0  # a fresh prompt: the common case, at C speed
    num_hit = len(present)
    while num_hit:
        first_needed = first_needed_block(num_hit * block_size)
        missing = num_hit - 1
        while missing >= first_needed and present[missing]:
            missing -= 1
        if missing < first_needed:
            break
        num_hit = missing
    if num_hit == 0:
        return _NO_BLOCKS, 0
    get_one_block = cached.get_one_block
    return ([block_pool.null_block] * first_needed + [get_one_block(block_hash)
                                                      for block_hash in block_hashes[first_needed:num_hit]],
            num_hit * block_size)
