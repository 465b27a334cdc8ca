"""The prefix cache's index: block hash -> the physical blocks holding that content.

Two requests can fill blocks with the same content before either is cached (two prompts with the
same prefix prefilled in one step, or chunk by chunk side by side). Like vLLM's V1 block pool, every
such block is registered under its hash: each one stays cached (evicted in LRU order, not reused at
once), and a lookup returns the oldest copy still cached, so when that one is evicted the next copy
still serves hits. Most hashes have one block, so an entry is the block itself until a second copy
arrives, and a lookup costs one dict access.

Invariant: an entry holds exactly the blocks whose ``block_hash`` is its key, in the order they were
registered; no entry is empty.
"""

from __future__ import annotations

from collections.abc import Iterator

from engine.core.free_block_queue import KVCacheBlock


class CachedBlockMap:
    __slots__ = ("_entries",)

    def __init__(self) -> None:
        # hash -> the block, or {block_id: block} in registration order once there are copies.
        self._entries: dict[bytes, KVCacheBlock | dict[int, KVCacheBlock]] = {}

    def get_one_block(self, block_hash: bytes) -> KVCacheBlock | None:
        """The oldest cached block with this content, or None."""
        entry = self._entries.get(block_hash)
        if entry is None or isinstance(entry, KVCacheBlock):
            return entry
        return next(iter(entry.values()))

    def insert(self, block_hash: bytes, block: KVCacheBlock) -> None:
        entry = self._entries.get(block_hash)
        if entry is None:
            self._entries[block_hash] = block
        elif isinstance(entry, KVCacheBlock):
            self._entries[block_hash] = {entry.block_id: entry, block.block_id: block}
        else:
            entry[block.block_id] = block

    def pop(self, block_hash: bytes, block: KVCacheBlock) -> bool:
        """Remove this block from its hash's entry; False if it was not there."""
        entry = self._entries.get(block_hash)
        if entry is None:
            return False
        if isinstance(entry, KVCacheBlock):
            if entry is not block:
                return False
            del self._entries[block_hash]
            return True
        if entry.get(block.block_id) is not block:
            return False
        del entry[block.block_id]
        if len(entry) == 1:
            self._entries[block_hash] = next(iter(entry.values()))
        return True

    def clear(self) -> None:
        self._entries.clear()

    def blocks(self) -> Iterator[KVCacheBlock]:
        """Every cached block."""
        for entry in self._entries.values():
            if isinstance(entry, KVCacheBlock):
                yield entry
            else:
                yield from entry.values()

    def block_ids(self) -> dict[bytes, tuple[int, ...]]:
        """hash -> the ids of its blocks in registration order (for tests and state comparisons)."""
        return {block_hash: (entry.block_id,) if isinstance(entry, KVCacheBlock) else tuple(entry)
                for block_hash, entry in self._entries.items()}

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._entries

    def __len__(self) -> int:
        """How many distinct hashes are cached."""
        return len(self._entries)

    def hashes(self) -> set[bytes]:
        return set(self._entries)
