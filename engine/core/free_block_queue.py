"""KV-cache blocks and the queue of free ones.

The free queue is a doubly linked list threaded through the blocks themselves, so that a block can
leave from the middle in O(1) when a prefix-cache hit revives it (``touch``). Its order is the
eviction order: the front is reused first.

- A finished request's blocks are appended tail block first, so that a request's last blocks (the
  least likely to be shared) are evicted before its first ones.
- A block that holds no hash (never filled, or evicted) goes to the *front*: reusing it destroys no
  cached content.

A pool's blocks are made on first use (``BlockStore``), and the queue of a fresh pool holds them as a *fresh
range* of ids, not as linked nodes: a pool of a million blocks costs nothing until requests use them, and a
simulation of a large GPU builds only the blocks its workload touches. The range sits in the list as one marker
node; the order is unchanged by it. Blocks freed unhashed go to the front (before the range), hashed ones to the
back (after it); a never-used block leaves only from the range's start, so the range stays a range.
Invariant: the marker is linked exactly while the range is not empty, and the range's blocks are in no list.
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


class BlockStore:
    """Every block of a pool by id, each made the first time anything asks for it (its state is a new block's
    until then, so making it late changes nothing)."""

    __slots__ = ("num_blocks", "_made")

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._made: dict[int, KVCacheBlock] = {}

    def __getitem__(self, block_id: int) -> KVCacheBlock:
        block = self._made.get(block_id)
        if block is None:
            if not 0 <= block_id < self.num_blocks:
                raise IndexError(f"block id {block_id} is outside the pool's {self.num_blocks} blocks")
            block = self._made[block_id] = KVCacheBlock(block_id)
        return block

    def __len__(self) -> int:
        return self.num_blocks

    def __iter__(self) -> Iterator[KVCacheBlock]:
        """Every block, in id order (making those not made yet: for tests and tools, not the step loop)."""
        return (self[block_id] for block_id in range(self.num_blocks))

    def made(self) -> Iterator[KVCacheBlock]:
        """The blocks made so far, in the order they were made."""
        return iter(self._made.values())

    @property
    def num_made(self) -> int:
        return len(self._made)


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks with sentinel head and tail nodes, and a fresh range of never-used ids
    (``fresh_range``) at the place of a marker node."""

    __slots__ = ("num_free_blocks", "_head", "_tail", "_marker", "_store", "_next_fresh", "_fresh_end")

    def __init__(self, blocks: Iterable[KVCacheBlock] = ()) -> None:
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free_block = self._tail
        self._tail.prev_free_block = self._head
        self._marker = KVCacheBlock(-2)
        self._store: BlockStore | None = None
        self._next_fresh = self._fresh_end = 0
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    @classmethod
    def fresh_range(cls, store: BlockStore, first: int, end: int) -> FreeKVCacheBlockQueue:
        """A queue of blocks ``first .. end - 1`` of ``store`` in id order, none of them made yet."""
        queue = cls()
        if first < end:
            queue._store, queue._next_fresh, queue._fresh_end = store, first, end
            queue.append(queue._marker)
            queue.num_free_blocks = end - first
        return queue

    def popleft(self) -> KVCacheBlock:
        return self.popleft_n(1)[0]

    def popleft_n(self, count: int) -> list[KVCacheBlock]:
        if count > self.num_free_blocks:
            if not self.num_free_blocks:
                raise ValueError("no free blocks left")
            raise ValueError(f"asked for {count} free blocks, only {self.num_free_blocks} left")
        taken = []
        block = self._head.next_free_block
        marker = self._marker
        remaining = count
        while remaining:
            if block is marker:
                # The fresh range's next blocks, made now; the marker leaves with the range's last block.
                start = self._next_fresh
                number = min(remaining, self._fresh_end - start)
                store = self._store
                taken.extend([store[block_id] for block_id in range(start, start + number)])
                self._next_fresh = start + number
                remaining -= number
                if self._next_fresh == self._fresh_end:
                    following = marker.next_free_block
                    marker.prev_free_block = marker.next_free_block = None
                    block = following
                continue
            taken.append(block)
            following = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = following
            remaining -= 1
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
        self.num_free_blocks += 1  # (the marker's count is set by fresh_range)

    def appendleft(self, block: KVCacheBlock) -> None:
        """Make ``block`` the next to be reused."""
        first = self._head.next_free_block
        self._head.next_free_block = block
        block.prev_free_block = self._head
        block.next_free_block = first
        first.prev_free_block = block
        self.num_free_blocks += 1

    def contains(self, block: KVCacheBlock) -> bool:
        return block.prev_free_block is not None or (
            self._store is not None and self._next_fresh <= block.block_id < self._fresh_end)

    def __iter__(self) -> Iterator[KVCacheBlock]:
        """The free blocks in the order they will be taken (the fresh range's made as they are reached)."""
        block = self._head.next_free_block
        while block is not self._tail:
            if block is self._marker:
                store = self._store
                for block_id in range(self._next_fresh, self._fresh_end):
                    yield store[block_id]
            else:
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
