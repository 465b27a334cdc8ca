"""Runs of consecutive physical block ids in a block table: how scattered the KV a step gathers lies.

On a CPU a request's blocks in one run stream in as one read; blocks scattered over the cache gather much more
slowly (the prefetcher follows a run, not a jump), so the KV-cache manager counts runs for the cost models.
"""

from __future__ import annotations

from engine.core.free_block_queue import KVCacheBlock


def block_runs(blocks: list[KVCacheBlock], previous_id: int | None = None) -> int:
    """Maximal runs of consecutive block ids in ``blocks``, appended after a block ``previous_id``
    (None: the start of a table). [7, 8, 9, 3, 4] holds two runs; after block 6, still two. The null
    block (a sliding window's skipped entries, always leading) is no run: nothing reads it."""
    runs = 0
    for block in blocks:
        if block.is_null:
            continue
        if block.block_id != (previous_id if previous_id is not None else -2) + 1:
            runs += 1
        previous_id = block.block_id
    return runs


def last_block_id(req_blocks: list[KVCacheBlock]) -> int | None:
    """The id new blocks follow for ``block_runs``: None for an empty table or one of null blocks only."""
    if not req_blocks or req_blocks[-1].is_null:
        return None
    return req_blocks[-1].block_id
