"""An eviction policy a test names as ``eviction_policy "module:Class"``: a user's own (most recently freed first)."""

from __future__ import annotations


class MostRecentlyFreedFirst:
    """Evict the cached block freed last: the opposite of LRU (a scan protects what it found cached)."""

    def __init__(self) -> None:
        self.stack = []

    def add(self, block) -> None:
        self.stack.append(block)

    def remove(self, block) -> None:
        self.stack.remove(block)

    def pop(self):
        return self.stack.pop()

    def record_hit(self, block) -> None:
        pass

    def contains(self, block) -> bool:
        return block in self.stack

    def __iter__(self):
        return iter(reversed(self.stack))

    def __len__(self) -> int:
        return len(self.stack)


class NotAPolicy:
    pass
