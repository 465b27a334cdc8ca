"""A second tier of the prefix cache in host (CPU) memory: vLLM's KV offloading (``--kv-offloading-size``).

vLLM's offloading connector copies every full block's KV to pinned host memory once the GPU has computed it,
and when a prompt's prefix misses the GPU's prefix cache but hits the host's, it loads those blocks back
(asynchronously, beside the model's steps) instead of recomputing them. The host tier is far larger than the
GPU's, so prefixes evicted from the GPU by other traffic survive there.

This file keeps the scheduler's side: which blocks the host holds, by their chained hash (the same key as
the GPU's prefix cache), in least-recently-used order, and the slot of the host's cache each one occupies.
The bytes move in the executor: the real runner copies blocks between its KV cache and a host cache
(engine/runner/host_kv_cache.py) as the scheduler's outputs say; the simulator times a load over the host
link (sim/kv_offload_loads.py), and the copies to the host overlap the steps and are not timed there.

A slot is reused as soon as its hash is evicted: the copy into it is made at the start of the next step
(``SchedulerOutput.offload_stores``, before any block is zeroed or written), and a load reads its slots in
the step that starts it (``SchedulerOutput.offload_loads``, after the stores), so a lookup always finds the
slot holding what its hash names by the time the load reads it.

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
        # Hash -> host slot, oldest use first; and the slots no hash holds.
        self._blocks: OrderedDict[bytes, int] = OrderedDict()
        self._hash_in_slot: dict[int, bytes] = {}
        self._free_slots = list(range(capacity_blocks - 1, -1, -1))
        self.num_stored = 0      # blocks copied to the host (each store of a hash it did not hold)
        self.num_evicted = 0     # blocks dropped to make room

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._blocks

    def hashes(self) -> list[bytes]:
        """Every hash held, least recently used first."""
        return list(self._blocks)

    def slot(self, block_hash: bytes) -> int:
        return self._blocks[block_hash]

    def hash_in_slot(self, slot: int) -> bytes | None:
        return self._hash_in_slot.get(slot)

    def store(self, block_hashes: Sequence[bytes]) -> list[int | None]:
        """Hold these blocks, evicting the least recently used: for each, the host slot its KV must be copied
        to, or None when the host holds it already (it only becomes the most recently used)."""
        blocks = self._blocks
        slots: list[int | None] = []
        for block_hash in block_hashes:
            if block_hash in blocks:
                blocks.move_to_end(block_hash)
                slots.append(None)
                continue
            if not self._free_slots:
                evicted, freed = blocks.popitem(last=False)
                del self._hash_in_slot[freed]
                self._free_slots.append(freed)
                self.num_evicted += 1
            slot = self._free_slots.pop()
            blocks[block_hash] = slot
            self._hash_in_slot[slot] = block_hash
            slots.append(slot)
            self.num_stored += 1
        return slots

    def forget_slots(self, slots: Sequence[int]) -> None:
        """The copies into these slots were never made (the step that carried them failed): whatever hash the
        host tier lists there is dropped, so no load ever reads them."""
        for slot in slots:
            block_hash = self._hash_in_slot.pop(slot, None)
            if block_hash is not None:
                del self._blocks[block_hash]
                self._free_slots.append(slot)

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
