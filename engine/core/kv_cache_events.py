"""KV-cache events: what a subscriber (a KV-aware router, a dashboard) needs to mirror the prefix cache.

Events are recorded only when enabled, in the order the changes happen, and drained with
``KVCacheManager.take_events()``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks entered the prefix cache. ``block_hashes`` continue the chain after ``parent_block_hash``."""
    block_hashes: tuple[bytes, ...]
    parent_block_hash: bytes | None
    token_ids: tuple[int, ...]
    block_size: int


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks left the prefix cache (evicted so the physical block could be reused)."""
    block_hashes: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The whole prefix cache was reset."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared
