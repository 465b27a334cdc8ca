"""KV-cache blocks and the queue of free ones.

The free queue is a doubly linked list threaded through the blocks themselves, so that a block can
leave from the middle in O(1) when a prefix-cache hit revives it (``touch``). Its order is the
eviction order: the front is reused first.

- A finished request's blocks are appended tail block first, so that a request's last blocks (the
  least likely to be shared) are evicted before its first ones.
- A block that holds no hash (never filled, or evicted) goes to the *front*: reusing it destroys no
  cached content.
"""

from __future__ import annotations

from typing import Iterable, Iterator


class KVCacheBlock:
    """One physical KV block. ``ref_cnt`` counts the live requests whose block table holds it."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free_block", "next_free_block", "is_null")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        # Set while the block is full and registered in the prefix cache; None otherwise.
        self.block_hash: bytes | None = None
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None
        self.is_null = False

    def __repr__(self) -> str:
        digest = self.block_hash.hex()[:8] if self.block_hash else None
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, hash={digest})"


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks with sentinel head and tail nodes."""

    __slots__ = ("num_free_blocks", "_head", "_tail")

    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free_block = self._tail
        self._tail.prev_free_block = self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free_block
        if block is self._tail:
            raise ValueError("no free blocks left")
        self._unlink(block)
        return block

    def popleft_n(self, count: int) -> list[KVCacheBlock]:
        if count > self.num_free_blocks:
            raise ValueError(f"asked for {count} free blocks, only {self.num_free_blocks} left")
        taken = []
        block = self._head.next_free_block
        for _ in range(count):
            taken.append(block)
            following = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = following
        self._head.next_free_block = block
        block.prev_free_block = self._head
        self.num_free_blocks -= count
        return taken

    def remove(self, block: KVCacheBlock) -> None:
        if block.prev_free_block is None:
            raise ValueError(f"{block} is not in the free queue")
        self._unlink(block)

    def append(self, block: KVCacheBlock) -> None:
        """Make ``block`` the last to be reused."""
        last = self._tail.prev_free_block
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self._tail
        self._tail.prev_free_block = block
        self.num_free_blocks += 1

    def appendleft(self, block: KVCacheBlock) -> None:
        """Make ``block`` the next to be reused."""
        first = self._head.next_free_block
        self._head.next_free_block = block
        block.prev_free_block = self._head
        block.next_free_block = first
        first.prev_free_block = block
        self.num_free_blocks += 1

    def contains(self, block: KVCacheBlock) -> bool:
        return block.prev_free_block is not None

    def __iter__(self) -> Iterator[KVCacheBlock]:
        block = self._head.next_free_block
        while block is not self._tail:
            yield block
            block = block.next_free_block

    def __len__(self) -> int:
        return self.num_free_blocks

    def _unlink(self, block: KVCacheBlock) -> None:
        previous, following = block.prev_free_block, block.next_free_block
        previous.next_free_block = following
        following.prev_free_block = previous
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1
