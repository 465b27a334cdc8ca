"""Block hashes under a KV-cache group's tag, for a hybrid model's prefix cache."""

from __future__ import annotations


class NamespacedHashes:
    """A request's block hashes as one KV-cache group of a hybrid model sees them (engine/core/
    hybrid_kv_cache_manager.py): each with the group's tag appended, so that the prefix cache keeps each
    group's blocks apart (a block of one group holds its layers' KV, not another's). Indexed and sliced as the
    list is, each hash tagged as it is read: making one copies no hash."""

    __slots__ = ("hashes", "tag")

    def __init__(self, hashes: list[bytes], tag: bytes) -> None:
        self.hashes = hashes
        self.tag = tag

    def __len__(self) -> int:
        return len(self.hashes)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [block_hash + self.tag for block_hash in self.hashes[index]]
        return self.hashes[index] + self.tag
