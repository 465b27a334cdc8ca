"""A second tier of the prefix cache in host (CPU) memory: vLLM's KV offloading (``--kv-offloading-size``).

vLLM's offloading connector copies every full block's KV to pinned host memory once the GPU has computed it,
and when a prompt's prefix misses the GPU's prefix cache but hits the host's, it loads those blocks back
(asynchronously, beside the model's steps) instead of recomputing them. The host tier is far larger than the
GPU's, so prefixes evicted from the GPU by other traffic survive there.

This file keeps the scheduler's side: which blocks the host holds, by their chained hash (the same key as
the GPU's prefix cache), in least-recently-used order. The bytes move in the executor: the simulator times
a load over the host link (sim/kv_offload_loads.py); the copies to the host overlap the steps and are not
timed (they leave the GPU's memory alone and run on the copy engines).

Invariants:
- the tier holds at most ``capacity_blocks`` hashes;
- a hash enters only once a batch that computed its block's KV is back (``KVCacheManager.offload_computed``),
  so a load never brings KV that was never computed;
- a lookup and a store both make the blocks they name the most recently used.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class OffloadedBlocks:
    def __init__(self, capacity_blocks: int) -> None:
        if not isinstance(capacity_blocks, int) or capacity_blocks < 1:
            raise ValueError(f"capacity_blocks must be a positive integer, got {capacity_blocks!r}")
        self.capacity_blocks = capacity_blocks
        # Oldest use first; the values are unused (a hash is all the scheduler needs of a block).
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self.num_stored = 0      # blocks copied to the host (each store of a hash it did not hold)
        self.num_evicted = 0     # blocks dropped to make room

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._blocks

    def hashes(self) -> list[bytes]:
        """Every hash held, least recently used first."""
        return list(self._blocks)

    def store(self, block_hashes: Sequence[bytes]) -> None:
        """The blocks' KV has been copied to the host: hold them, evicting the least recently used."""
        blocks = self._blocks
        for block_hash in block_hashes:
            if block_hash in blocks:
                blocks.move_to_end(block_hash)
                continue
            if len(blocks) >= self.capacity_blocks:
                blocks.popitem(last=False)
                self.num_evicted += 1
            blocks[block_hash] = None
            self.num_stored += 1

    def lookup(self, block_hashes: Sequence[bytes], first: int, end: int) -> int:
        """How many consecutive blocks from ``first`` (before ``end``) the host holds; they become the most
        recently used. A prefix can only continue a prefix: the count stops at the first miss."""
        blocks = self._blocks
        count = 0
        for index in range(first, end):
            block_hash = block_hashes[index]
            if block_hash not in blocks:
                break
            blocks.move_to_end(block_hash)
            count += 1
        return count
