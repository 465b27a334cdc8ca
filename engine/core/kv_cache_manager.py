"""Per-request KV block tables on top of the block pool, with prefix caching.

Contract (each method states what it may change):
- ``get_computed_blocks`` changes nothing: it only looks up the longest cached prefix.
- ``allocate_slots`` is all or nothing: it either gives the request blocks for every token it needs
  and returns the newly allocated blocks, or returns None and changes no reference count, no free
  queue position and no block table (beyond ``free_blocks_out_of_window``, which it runs first).
- ``free`` drops the request's references, tail block first, so its tail is evicted first.

Invariant: ``ref_cnt`` of every block equals the number of live requests whose block table holds it.
Invariant: every hash in the host tier (``offload``, engine/core/kv_offload.py) names KV a batch computed.
A hybrid model's KV cache (engine/core/hybrid_kv_cache_manager.py) is one such manager per group of layers over
one shared pool, each caching its blocks under its own hash tag.

Invariant: ``num_block_runs`` equals the number of maximal runs of consecutive block ids summed over
every live request's block table (``block_runs``; the null block is no run).

Sliding window (``sliding_window``: every layer of the model attends only its last ``sliding_window`` keys,
Mistral-7B-v0.1's 4096): a block whose every token lies before the window of the request's next query is
never read again, so ``allocate_slots`` hands it back and the table holds the null block in its place, as
vLLM's sliding-window manager does. Invariant: a request's null entries are a leading run of its table, of
length ``num_skipped_block``, and lie wholly before ``num_computed_tokens - num_rollback_tokens -
sliding_window + 1``; every block from there on is real. A block is skipped only once the prefix cache (and the host tier) has it, so
that what it held stays findable until evicted.

Chunked local attention (``attention_chunk``: a KV-cache group of Llama 4's chunked layers, whose query at position
p reads only the keys of its own chunk, from ``p - p % attention_chunk``) hands back blocks the same way, the
first needed key being the start of the chunk of the earliest query that may still run: vLLM's chunked local
attention manager. The same invariant holds with that first key.
"""

from __future__ import annotations

from engine.core.block_pool import BlockPool
from engine.core.block_runs import block_runs, last_block_id
from engine.core.free_block_queue import KVCacheBlock
from engine.core.kv_cache_events import KVCacheEvent
from engine.core.kv_offload import OffloadedBlocks
from engine.core.namespaced_hashes import NamespacedHashes
from engine.core.prefix_cache_stats import PrefixCacheStats
from engine.core.request import Request
from engine.core.windowed_hit import windowed_hit

_NO_BLOCKS: list[KVCacheBlock] = []


class KVCacheManager:
    def __init__(self, num_gpu_blocks: int, block_size: int, max_model_len: int, *, enable_caching: bool = True,
                 enable_kv_cache_events: bool = False, num_offload_blocks: int = 0,
                 sliding_window: int | None = None, num_rollback_tokens: int = 0,
                 block_pool: BlockPool | None = None, hash_tag: bytes = b"", eviction_policy: str = "lru",
                 attention_chunk: int | None = None) -> None:
        """``block_pool`` and ``hash_tag``: one KV-cache group of a hybrid model, its blocks drawn from the pool
        every group shares and cached under its own tag (engine/core/hybrid_kv_cache_manager.py).
        ``attention_chunk``: the group's layers attend within chunks of that many tokens (module docstring)."""
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size!r}")
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be positive or None, got {sliding_window!r}")
        if attention_chunk is not None and (attention_chunk < 1 or sliding_window is not None):
            raise ValueError(f"attention_chunk must be positive, and None with a sliding window, got {attention_chunk!r}")
        self.block_size = block_size
        self.sliding_window = sliding_window
        self.attention_chunk = attention_chunk
        # Leading blocks no later query reads are handed back (a window's or a chunk's; module docstring).
        self.frees_leading_blocks = sliding_window is not None or attention_chunk is not None
        # Computed tokens that may still be taken back (rejected speculative drafts): the window is kept that
        # much wider, so that a rollback never needs a block already handed back.
        self.num_rollback_tokens = num_rollback_tokens
        # Leading entries of each request's table that hold the null block (see the module docstring).
        self.num_skipped_block: dict[str, int] = {}
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.block_pool = block_pool if block_pool is not None else BlockPool(num_gpu_blocks, enable_caching,
                                                                              enable_kv_cache_events, eviction_policy)
        self.hash_tag = hash_tag
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # Number of leading blocks of each request already registered in the prefix cache.
        self.num_cached_block: dict[str, int] = {}
        # Runs of consecutive physical block ids per request, and their sum over all requests. Reading
        # a request's KV gathers its blocks; on a CPU, blocks scattered over the cache gather much more
        # slowly than consecutive ones (the prefetcher streams a run, not a jump), so cost models read it.
        self.num_block_runs_of: dict[str, int] = {}
        self.num_block_runs = 0
        self.prefix_cache_stats = PrefixCacheStats()
        # The host-memory tier of the prefix cache (KV offloading), and how many leading blocks of each live
        # request it has been given since the request last got its blocks.
        self.offload = OffloadedBlocks(num_offload_blocks) if num_offload_blocks and enable_caching else None
        self.num_offloaded_block: dict[str, int] = {}
        # Copies to the host decided since the last schedule: (GPU block id, host slot), made by the executor at
        # the start of the next step, before that step zeroes or writes any block.
        self.pending_offload_stores: list[tuple[int, int]] = []

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.get_num_free_blocks()

    @property
    def num_usable_blocks(self) -> int:
        return self.block_pool.num_usable_blocks

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest block-aligned cached prefix of the request, and its length in tokens.

        Capped at ``num_tokens - 1`` so that at least the last token is computed: the model must
        produce logits for it. Requests asking for prompt logprobs, or pooling every position (MEAN, CLS),
        skip the cache (they need outputs of positions a hit would not compute).
        """
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return _NO_BLOCKS, 0
        return self.longest_hit(request, (request.num_tokens - 1) // self.block_size)

    def longest_hit(self, request: Request, max_hit_blocks: int) -> tuple[list[KVCacheBlock], int]:
        """``get_computed_blocks`` with the hit capped at ``max_hit_blocks`` blocks (a hybrid model's groups must
        agree on one length: each is asked again, capped at the shortest so far)."""
        block_size = self.block_size
        get_one_block = self.block_pool.cached_block_hash_to_block.get_one_block
        block_hashes = self.block_hashes_of(request)
        if self.frees_leading_blocks:
            return windowed_hit(block_hashes[:max_hit_blocks], self.block_pool, self.block_size,
                                self.first_needed_block)
        hits: list[KVCacheBlock] = []
        for block_hash in block_hashes[:max_hit_blocks]:
            block = get_one_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * block_size

    def block_hashes_of(self, request: Request):
        """The request's block hashes under this manager's tag (a hybrid model's group), else as they are."""
        return NamespacedHashes(request.block_hashes, self.hash_tag) if self.hash_tag else request.block_hashes

    def first_needed_block(self, num_computed_tokens: int) -> int:
        """The first block the window (or chunk) of the query at position ``num_computed_tokens`` reaches, less
        any computed tokens that may yet be taken back. Never decreases as ``num_computed_tokens`` grows."""
        earliest_query = num_computed_tokens - self.num_rollback_tokens
        if self.attention_chunk is not None:
            first_key = earliest_query - earliest_query % self.attention_chunk
        else:
            first_key = earliest_query - self.sliding_window + 1
        return max(0, first_key) // self.block_size

    def offloaded_hit_tokens(self, request: Request, num_hit_tokens: int) -> int:
        """Tokens past the GPU's hit of ``num_hit_tokens`` whose blocks the host tier holds, block-aligned and,
        like a GPU hit, leaving at least the last prompt token to compute. 0 without a host tier."""
        offload = self.offload
        if offload is None or request.skip_reading_prefix_cache:
            return 0
        block_size = self.block_size
        return block_size * offload.lookup(request.block_hashes, num_hit_tokens // block_size,
                                           (request.num_tokens - 1) // block_size)

    def offload_computed(self, request: Request, num_computed_tokens: int) -> None:
        """A batch that brought the request's KV to ``num_computed_tokens`` is back: copy its full blocks that the
        host was not given yet (since the request got its blocks) to the host tier."""
        request_id = request.request_id
        num_full_blocks = min(num_computed_tokens // self.block_size, len(request.block_hashes))
        num_offloaded = self.num_offloaded_block.get(request_id, 0)
        if num_full_blocks > num_offloaded:
            slots = self.offload.store(request.block_hashes[num_offloaded:num_full_blocks])
            blocks = self.req_to_blocks[request_id]
            self.pending_offload_stores.extend((blocks[index].block_id, slot)
                                               for index, slot in enumerate(slots, num_offloaded) if slot is not None)
            self.num_offloaded_block[request_id] = num_full_blocks

    def take_offload_stores(self) -> list[tuple[int, int]]:
        """The copies to the host for the executor, one per slot: when an update stores more new blocks than the
        tier holds, a slot handed out is reused within it, and only its last block belongs there (a copy of an
        earlier one, made in the same batch of copies, could land last)."""
        stores, self.pending_offload_stores = self.pending_offload_stores, []
        if len(stores) > 1:
            last_block_of_slot = {slot: block_id for block_id, slot in stores}
            if len(last_block_of_slot) < len(stores):
                stores = [(block_id, slot) for slot, block_id in last_block_of_slot.items()]
        return stores

    def record_prefix_cache_query(self, request: Request, num_hit_tokens: int) -> None:
        """Count a lookup once the request is admitted (a failed admission retries and is not counted)."""
        if self.enable_caching:
            self.prefix_cache_stats.record(request.num_tokens, num_hit_tokens, request.num_preemptions > 0)

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: list[KVCacheBlock] | None = None,
                       num_lookahead_tokens: int = 0, delay_cache_blocks: bool = False,
                       hybrid_prepared: bool = False) -> list[KVCacheBlock] | None:
        """Give the request KV slots for ``num_new_tokens`` more tokens, after its cached prefix.

        ``new_computed_blocks`` / ``num_new_computed_tokens`` are a prefix-cache hit from
        ``get_computed_blocks`` for a request being admitted. Returns the newly allocated blocks
        (possibly empty) or None when the pool cannot hold them. ``delay_cache_blocks``: the new tokens'
        KV comes from another engine, so their blocks enter the prefix cache only once it has arrived
        (``cache_blocks``); another request must not hit blocks whose contents are still in flight.
        ``hybrid_prepared``: a hybrid model's manager has handed back out-of-window blocks and taken the hit's
        references already, every group's before any group takes a new block (one group's new block must not
        evict another group's hit).
        """
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be positive, got {num_new_tokens!r}")
        request_id = request.request_id
        req_blocks = self.req_to_blocks.get(request_id)
        block_size = self.block_size
        if self.frees_leading_blocks and req_blocks is not None and not hybrid_prepared:
            self.free_blocks_out_of_window(request)
        if req_blocks is not None and not new_computed_blocks and not num_lookahead_tokens:
            # Fast path, the common decode step: the last block still has room and no block fills up.
            num_tokens_after = request.num_computed_tokens + num_new_tokens
            if num_tokens_after <= len(req_blocks) * block_size and (
                    not self.enable_caching
                    or min(num_tokens_after, request.num_tokens) // block_size == self.num_cached_block[request_id]):
                return _NO_BLOCKS
        is_new_request = req_blocks is None
        if is_new_request:
            # Registered only once the allocation succeeds: a failure must leave no trace.
            req_blocks = []
        block_pool = self.block_pool
        num_computed_tokens = request.num_computed_tokens + num_new_computed_tokens
        num_tokens_need_slot = num_computed_tokens + num_new_tokens + num_lookahead_tokens
        if num_tokens_need_slot > self.max_model_len:
            num_tokens_need_slot = self.max_model_len
        num_required_blocks = -(-num_tokens_need_slot // block_size)
        num_free = block_pool.free_block_queue.num_free_blocks
        if new_computed_blocks:
            num_new_blocks = num_required_blocks - len(req_blocks) - len(new_computed_blocks)
            # A sliding-window hit starts with null blocks (windowed_hit.py): no reference to take.
            num_null_hits = 0
            while num_null_hits < len(new_computed_blocks) and new_computed_blocks[num_null_hits].is_null:
                num_null_hits += 1
            real_hits = new_computed_blocks[num_null_hits:] if num_null_hits else new_computed_blocks
            if not hybrid_prepared:
                # Hits that sit in the free queue are taken out of it, so they count against it too.
                num_evictable_hits = sum(1 for block in real_hits if block.ref_cnt == 0)
                if num_new_blocks + num_evictable_hits > num_free:
                    return None
                block_pool.touch(real_hits)
            elif num_new_blocks > num_free:
                return None
            new_runs = block_runs(real_hits, last_block_id(req_blocks))
            req_blocks.extend(new_computed_blocks)
        else:
            num_new_blocks = num_required_blocks - len(req_blocks)
            if num_new_blocks > num_free:
                return None
            new_runs = 0
        if num_new_blocks > 0:
            new_blocks = block_pool.get_new_blocks(num_new_blocks)
            new_runs += block_runs(new_blocks, last_block_id(req_blocks))
            req_blocks.extend(new_blocks)
        else:
            new_blocks = _NO_BLOCKS
        if is_new_request:
            self.req_to_blocks[request_id] = req_blocks
            # A hit's blocks are cached already (and a sliding-window hit's null blocks must never be).
            self.num_cached_block[request_id] = len(new_computed_blocks) if new_computed_blocks else 0
            self.num_block_runs_of[request_id] = 0
            if self.frees_leading_blocks:
                self.num_skipped_block[request_id] = num_null_hits if new_computed_blocks else 0
        self.num_block_runs_of[request_id] += new_runs
        self.num_block_runs += new_runs
        if self.enable_caching:
            # Blocks whose every token is known are cached now, before they are computed: the runner
            # writes every token's KV before any attention of the same step reads it.
            num_tokens_to_cache = num_computed_tokens if delay_cache_blocks else num_computed_tokens + num_new_tokens
            if num_tokens_to_cache > request.num_tokens:
                num_tokens_to_cache = request.num_tokens
            num_full_blocks = num_tokens_to_cache // block_size
            num_cached_blocks = self.num_cached_block[request_id]
            if num_full_blocks > num_cached_blocks:
                block_pool.cache_full_blocks(self.block_hashes_of(request), req_blocks, num_cached_blocks, num_full_blocks,
                                             request.all_token_ids, block_size)
                self.num_cached_block[request_id] = num_full_blocks
        return new_blocks

    def num_blocks_to_allocate(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                               new_computed_blocks: list[KVCacheBlock] | None = None,
                               num_lookahead_tokens: int = 0) -> int:
        """How many blocks ``allocate_slots`` with these arguments takes out of the free queue: new blocks, and
        hits that sit there. Changes nothing; run after ``free_blocks_out_of_window`` (a hybrid model's manager
        sums it over its groups to allocate all or nothing)."""
        req_blocks = self.req_to_blocks.get(request.request_id, _NO_BLOCKS)
        num_tokens_need_slot = min(request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
                                   + num_lookahead_tokens, self.max_model_len)
        hits = new_computed_blocks or _NO_BLOCKS
        num_new_blocks = max(0, -(-num_tokens_need_slot // self.block_size) - len(req_blocks) - len(hits))
        return num_new_blocks + sum(1 for block in hits if block.ref_cnt == 0 and not block.is_null)

    def free_blocks_out_of_window(self, request: Request) -> None:
        """Hand back the leading blocks no query of the live request will read again (module docstring).
        ``allocate_slots`` does it first, whether or not its allocation then succeeds."""
        self.free_blocks_out_of_window_at(request, request.num_computed_tokens)

    def free_blocks_out_of_window_at(self, request: Request, num_computed_tokens: int) -> None:
        """``free_blocks_out_of_window`` as it runs when the request has ``num_computed_tokens`` computed: the
        decode fast-forward replays a step's hand-back after it has advanced the request past that step."""
        request_id = request.request_id
        req_blocks = self.req_to_blocks[request_id]
        num_skipped = self.num_skipped_block[request_id]
        first_needed = self.first_needed_block(num_computed_tokens)
        if self.enable_caching:
            first_needed = min(first_needed, self.num_cached_block[request_id])
            if self.offload is not None:
                first_needed = min(first_needed, self.num_offloaded_block.get(request_id, 0))
        if first_needed <= num_skipped:
            return
        skipped = req_blocks[num_skipped:first_needed]
        # The runs the table loses: those of the skipped blocks, less one when the first block kept continued
        # the last one skipped (that run lives on, shorter). Counted on the skipped blocks only.
        lost_runs = block_runs(skipped)
        if first_needed < len(req_blocks) and req_blocks[first_needed].block_id == skipped[-1].block_id + 1:
            lost_runs -= 1
        req_blocks[num_skipped:first_needed] = [self.block_pool.null_block] * len(skipped)
        self.num_skipped_block[request_id] = first_needed
        # Oldest first: the free queue then evicts the start of the sequence first.
        self.block_pool.free_blocks(skipped)
        self.num_block_runs -= lost_runs
        self.num_block_runs_of[request_id] -= lost_runs

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register the request's full blocks up to ``num_computed_tokens`` in the prefix cache (its KV,
        loaded from another engine, has arrived; see ``delay_cache_blocks``)."""
        if not self.enable_caching:
            return
        request_id = request.request_id
        num_full_blocks = min(num_computed_tokens, request.num_tokens) // self.block_size
        num_cached_blocks = self.num_cached_block[request_id]
        if num_full_blocks > num_cached_blocks:
            self.block_pool.cache_full_blocks(self.block_hashes_of(request), self.req_to_blocks[request_id], num_cached_blocks,
                                              num_full_blocks, request.all_token_ids, self.block_size)
            self.num_cached_block[request_id] = num_full_blocks

    def free(self, request: Request) -> None:
        """Drop the request's blocks, tail first.

        Blocks are registered in the prefix cache when they are scheduled, before their KV is
        computed. A request freed before that computation (preempted in the step that scheduled it)
        must not leave such blocks findable: every cached block past ``num_computed_tokens`` leaves
        the cache first. For any other request this finds nothing to remove.
        """
        request_id = request.request_id
        blocks = self.req_to_blocks.pop(request_id, None)
        num_cached = self.num_cached_block.pop(request_id, 0)
        self.num_block_runs -= self.num_block_runs_of.pop(request_id, 0)
        self.num_offloaded_block.pop(request_id, None)
        num_skipped = self.num_skipped_block.pop(request_id, 0)
        if not blocks:
            return
        first_uncomputed = request.num_computed_tokens // self.block_size
        if num_cached > first_uncomputed:
            for block in blocks[first_uncomputed:num_cached]:
                if block.block_hash is not None and block.ref_cnt == 1:
                    self.block_pool.uncache_block(block)
        # The null entries of a sliding window hold no reference.
        self.block_pool.free_blocks(reversed(blocks[num_skipped:] if num_skipped else blocks))

    def append_block(self, request_id: str, block: KVCacheBlock) -> None:
        """Add a freshly allocated block to a live request's table (the decode fast-forward's path)."""
        req_blocks = self.req_to_blocks[request_id]
        # After a table of null blocks only (a window that skipped every block), as block_runs counts it.
        if not req_blocks or req_blocks[-1].is_null or block.block_id != req_blocks[-1].block_id + 1:
            self.num_block_runs_of[request_id] += 1
            self.num_block_runs += 1
        req_blocks.append(block)

    def get_blocks(self, request_id: str) -> list[KVCacheBlock]:
        return self.req_to_blocks.get(request_id, _NO_BLOCKS)

    def get_block_ids(self, request_id: str) -> list[int]:
        return [block.block_id for block in self.req_to_blocks.get(request_id, _NO_BLOCKS)]

    def get_num_common_prefix_blocks(self, request_id: str, num_running_requests: int) -> int:
        """Leading blocks shared by every running request (what cascade attention could exploit)."""
        count = 0
        for block in self.req_to_blocks.get(request_id, _NO_BLOCKS):
            if block.ref_cnt != num_running_requests:
                break
            count += 1
        return count

    def reset_prefix_cache(self) -> bool:
        reset = self.block_pool.reset_prefix_cache()
        if reset:
            self.prefix_cache_stats.resets += 1
        return reset

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """Return the statistics gathered since the last call and start new ones."""
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    def take_events(self) -> list[KVCacheEvent]:
        return self.block_pool.take_events()
