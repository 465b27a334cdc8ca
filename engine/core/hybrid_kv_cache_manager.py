"""KV blocks for a model whose layers mix sliding-window and full attention (Gemma 2/3, Qwen windowed layers):
one block table per KV-cache group, all drawn from one pool, as vLLM's hybrid KV-cache manager does.

Why: a full-attention layer reads every key of a sequence, a windowed layer only its last ``window``. Keeping
every block for every layer (``CacheConfig.kv_cache_groups`` unset) spends the windowed layers' memory on keys
they never read again. vLLM instead splits the layers into groups of equal size, each all full or all windowed
(Gemma-3-27B: 10 global layers, 52 local ones as 6 groups of 10, the last padded); a block holds one group's
layers for ``block_size`` tokens, so every group's blocks are the same size and come from one pool. A request
has one table per group: the full groups' hold every block, the windowed groups' hand back the blocks that fell
out of the window (engine/core/kv_cache_manager.py's null entries). A long sequence then holds blocks for its
whole length in the full groups only.

Each group is a ``KVCacheManager`` over the shared ``BlockPool``, caching its blocks under its own hash tag.
Contract, as ``KVCacheManager``'s, over all groups at once:
- ``get_computed_blocks``: the longest hit every group has: each group is searched capped at the shortest hit
  so far until they agree (a windowed group's hit of n blocks needs only the blocks its window reaches, so a
  shorter cap can fail where a longer one held: hence the repeat). Changes nothing.
- ``allocate_slots``: all or nothing. Each windowed group first hands back its out-of-window blocks; then the
  blocks every group needs are counted against the free queue; then every group's hits are touched before any
  group takes a new block (a new block of one group would otherwise evict another group's hit).
- ``free``: every group's blocks, group by group, each tail first.

Invariants: every group's table of a request has the same length and the same number of cached blocks (so the
scheduler's inlined decode path, which reads group 0's, decides for all); a block belongs to at most one group's
table at a time and is cached under that group's tag only; ``ref_cnt`` of every block equals the number of
(request, group) tables holding it.

Llama 4's chunked layers are such groups too (``chunked_groups``: every group's int is then the chunk its layers
attend within, not a window): a chunked group hands back the blocks before the chunk of its request's next query,
as vLLM's chunked local attention manager does, so a long sequence holds at most a chunk's blocks there.

Not with KV offloading or KV transfer between engines (refused by ``CacheConfig`` and the simulator's setup).
"""

from __future__ import annotations

from engine.core.block_pool import BlockPool
from engine.core.free_block_queue import KVCacheBlock
from engine.core.kv_cache_events import KVCacheEvent
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.prefix_cache_stats import PrefixCacheStats
from engine.core.request import Request

_NO_BLOCKS: list[KVCacheBlock] = []


def group_tag(group: int) -> bytes:
    """The hash tag of group ``group``'s cached blocks; group 0 keeps the plain hashes."""
    return b"" if group == 0 else b"#g" + group.to_bytes(2, "little")


class HybridKVCacheManager:
    def __init__(self, num_gpu_blocks: int, block_size: int, max_model_len: int,
                 group_windows: tuple[int | None, ...], *, enable_caching: bool = True,
                 enable_kv_cache_events: bool = False, num_rollback_tokens: int = 0,
                 eviction_policy: str = "lru", chunked_groups: bool = False) -> None:
        if len(group_windows) < 2:
            raise ValueError(f"a hybrid KV cache needs two or more groups, got {group_windows!r}")
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.group_windows = tuple(group_windows)
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching, enable_kv_cache_events, eviction_policy)
        self.groups = [KVCacheManager(num_gpu_blocks, block_size, max_model_len, enable_caching=enable_caching,
                                      sliding_window=None if chunked_groups else window,
                                      attention_chunk=window if chunked_groups else None,
                                      num_rollback_tokens=num_rollback_tokens,
                                      block_pool=self.block_pool, hash_tag=group_tag(group))
                       for group, window in enumerate(group_windows)]
        self._windowed = [manager for manager in self.groups if manager.frees_leading_blocks]
        # Group 0's tables stand for every group's length and cached count (module invariant): the scheduler's
        # inlined decode path reads these two.
        self.req_to_blocks = self.groups[0].req_to_blocks
        self.num_cached_block = self.groups[0].num_cached_block
        self.offload = None
        # Windows are per group here; the decode fast-forward and cost features read the model's window from the
        # cache config, and this manager's None keeps single-table code paths away.
        self.sliding_window = None
        self.num_rollback_tokens = num_rollback_tokens

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.get_num_free_blocks()

    @property
    def num_usable_blocks(self) -> int:
        return self.block_pool.num_usable_blocks

    @property
    def num_block_runs(self) -> int:
        return sum(manager.num_block_runs for manager in self.groups)

    def get_computed_blocks(self, request: Request) -> tuple[tuple[list[KVCacheBlock], ...] | list, int]:
        """Every group's blocks of the longest hit they all hold, and its length in tokens (module docstring)."""
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return _NO_BLOCKS, 0
        num_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[list[KVCacheBlock]] = [_NO_BLOCKS] * len(self.groups)
        agreed = -1
        while agreed != num_hit_blocks and num_hit_blocks:
            agreed = num_hit_blocks
            for group, manager in enumerate(self.groups):
                blocks, num_tokens = manager.longest_hit(request, num_hit_blocks)
                hits[group] = blocks
                num_hit_blocks = num_tokens // self.block_size
                if not num_hit_blocks:
                    break
        if not num_hit_blocks:
            return _NO_BLOCKS, 0
        # A full group's hit may be longer than the agreed one: its prefix is a hit too. A windowed group's is
        # exactly the agreed length (it was searched capped there last).
        return tuple(blocks[:num_hit_blocks] for blocks in hits), num_hit_blocks * self.block_size

    def offloaded_hit_tokens(self, request: Request, num_hit_tokens: int) -> int:
        return 0  # no host tier (offload is None)

    def take_offload_stores(self) -> list[tuple[int, int]]:
        return []

    # The prefix-cache statistics are group 0's: one lookup per request, of the hit every group agreed on, and
    # one reset of the pool the groups share.
    def record_prefix_cache_query(self, request: Request, num_hit_tokens: int) -> None:
        self.groups[0].record_prefix_cache_query(request, num_hit_tokens)

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: tuple[list[KVCacheBlock], ...] | None = None,
                       num_lookahead_tokens: int = 0, delay_cache_blocks: bool = False):
        """Every group's slots for ``num_new_tokens`` more tokens, all or nothing (module docstring). Returns the
        newly allocated blocks per group, an empty list when no group took one, or None when the pool cannot
        hold them."""
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be positive, got {num_new_tokens!r}")
        groups = self.groups
        request_id = request.request_id
        if request_id in self.req_to_blocks:
            for manager in self._windowed:
                manager.free_blocks_out_of_window(request)
        hits = new_computed_blocks or (None,) * len(groups)
        if new_computed_blocks:
            needed = sum(manager.num_blocks_to_allocate(request, num_new_tokens, num_new_computed_tokens, group_hits,
                                                        num_lookahead_tokens)
                         for manager, group_hits in zip(groups, hits))
        else:
            # Without a hit every group's table has group 0's length (module invariant): each needs as many.
            needed = len(groups) * groups[0].num_blocks_to_allocate(request, num_new_tokens, num_new_computed_tokens,
                                                                    None, num_lookahead_tokens)
        if needed > self.block_pool.get_num_free_blocks():
            return None
        if new_computed_blocks:
            for group_hits in new_computed_blocks:
                self.block_pool.touch([block for block in group_hits if not block.is_null])
        allocated = []
        for manager, group_hits in zip(groups, hits):
            new_blocks = manager.allocate_slots(request, num_new_tokens, num_new_computed_tokens, group_hits,
                                                num_lookahead_tokens, delay_cache_blocks, hybrid_prepared=True)
            if new_blocks is None:  # the count above holds every group's need: a bug, never the workload
                raise RuntimeError(f"{request}: a group of the hybrid KV cache failed after the pool was counted")
            allocated.append(new_blocks)
        return tuple(allocated) if any(allocated) else _NO_BLOCKS

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        for manager in self.groups:
            manager.cache_blocks(request, num_computed_tokens)

    def free(self, request: Request) -> None:
        for manager in self.groups:
            manager.free(request)

    def get_blocks(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        return tuple(manager.get_blocks(request_id) for manager in self.groups)

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return tuple(manager.get_block_ids(request_id) for manager in self.groups)

    def get_num_common_prefix_blocks(self, request_id: str, num_running_requests: int) -> int:
        """Leading blocks every running request shares in every group (what cascade attention could use)."""
        return min(manager.get_num_common_prefix_blocks(request_id, num_running_requests) for manager in self.groups)

    def reset_prefix_cache(self) -> bool:
        return self.groups[0].reset_prefix_cache()

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        return self.groups[0].make_prefix_cache_stats()

    def take_events(self) -> list[KVCacheEvent]:
        return self.block_pool.take_events()
