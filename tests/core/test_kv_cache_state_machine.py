"""Hypothesis state machine for the block pool and KV-cache manager.

Random admissions (with shared prefixes, so prefix-cache hits happen), prefill chunks, decodes,
frees and prefix-cache resets on a pool small enough to run out. The test "computes" every slot it
is given by writing the token there, so it can check that a prefix-cache hit returns blocks whose
contents are exactly the request's leading tokens. Every DESIGN.md block invariant is checked after
every rule, and a failed allocation must change nothing at all. Some machines run a sliding window: then
blocks wholly before every request's window are handed back (and may be reused), what lies inside the
window must still hold the request's tokens, and a hit may start with null blocks.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

from engine.core import Request, SamplingParams
from engine.core.block_hash import make_block_hasher
from engine.core.kv_cache_manager import KVCacheManager

from tests.core.helpers import check_kv_invariants

PREFIXES = [list(range(1000, 1000 + 24)), list(range(2000, 2000 + 9)), []]


def snapshot(manager: KVCacheManager):
    pool = manager.block_pool
    return ([(b.ref_cnt, b.block_hash) for b in pool.blocks], [b.block_id for b in pool.free_block_queue],
            {rid: [b.block_id for b in blocks] for rid, blocks in manager.req_to_blocks.items()},
            dict(manager.num_cached_block), pool.cached_block_hash_to_block.block_ids())


class KVCacheMachine(RuleBasedStateMachine):
    requests = Bundle("requests")

    @initialize(num_blocks=st.integers(4, 24), block_size=st.sampled_from([2, 4, 8]),
                sliding_window=st.sampled_from([None, None, 1, 3, 5, 9]))
    def setup(self, num_blocks, block_size, sliding_window):
        self.block_size = block_size
        self.sliding_window = sliding_window
        self.manager = KVCacheManager(num_blocks, block_size, max_model_len=10_000, sliding_window=sliding_window)
        self.hasher = make_block_hasher(block_size)
        self.contents: dict[int, dict[int, int]] = {}  # block id -> slot offset -> token
        self.live: dict[str, Request] = {}
        self.counter = 0

    def first_visible(self, request: Request) -> int:
        """The first position the request's next query reads (0 without a window)."""
        if self.sliding_window is None:
            return 0
        return max(0, request.num_computed_tokens - self.sliding_window + 1)

    def write(self, request: Request, start: int, end: int) -> None:
        blocks = self.manager.get_blocks(request.request_id)
        for position in range(start, end):
            block = blocks[position // self.block_size]
            assert not block.is_null, f"position {position} of {request.request_id} has no block to be written in"
            slots = self.contents.setdefault(block.block_id, {})
            token = request.all_token_ids[position]
            if block.ref_cnt > 1:
                # A shared block may only be "rewritten" with the content it already holds.
                assert slots.get(position % self.block_size) == token
            slots[position % self.block_size] = token

    def allocate(self, request: Request, num_new_tokens: int, hits=None, num_hit_tokens=0) -> bool:
        if self.sliding_window is not None and hits is None:
            # allocate_slots hands back the blocks out of the window first, whatever comes next.
            self.manager.free_blocks_out_of_window(request)
        before = snapshot(self.manager)
        start = num_hit_tokens if hits is not None else request.num_computed_tokens
        if self.manager.allocate_slots(request, num_new_tokens, num_hit_tokens, hits) is None:
            assert snapshot(self.manager) == before, "a failed allocation changed the pool"
            return False
        if hits is not None:
            request.num_computed_tokens = num_hit_tokens
        self.write(request, start, start + num_new_tokens)
        request.num_computed_tokens = start + num_new_tokens
        return True

    @rule(target=requests, prefix=st.sampled_from(PREFIXES), suffix=st.lists(st.integers(0, 50), max_size=20),
          chunk=st.integers(1, 64), salt=st.sampled_from([None, None, "tenant"]))
    def admit(self, prefix, suffix, chunk, salt):
        tokens = prefix + suffix or [7]
        self.counter += 1
        request = Request(f"r{self.counter}", tokens, SamplingParams(), cache_salt=salt, block_hasher=self.hasher)
        hits, num_hit_tokens = self.manager.get_computed_blocks(request)
        assert num_hit_tokens % self.block_size == 0 and num_hit_tokens < request.num_tokens
        for index, block in enumerate(hits):
            if block.is_null:
                # A sliding-window hit needs no block before the window of its first computed token.
                assert self.sliding_window is not None and all(earlier.is_null for earlier in hits[:index])
                assert (index + 1) * self.block_size <= num_hit_tokens - self.sliding_window + 1
                continue
            # The cached content of each hit block is exactly the request's tokens for that block.
            expected = list(request.all_token_ids[index * self.block_size:(index + 1) * self.block_size])
            assert [self.contents[block.block_id][offset] for offset in range(self.block_size)] == expected
            assert block.block_hash == request.block_hashes[index]
        num_new_tokens = min(chunk, request.num_tokens - num_hit_tokens)
        if not self.allocate(request, num_new_tokens, hits, num_hit_tokens):
            return consumes_nothing(request)
        self.live[request.request_id] = request
        return request

    @rule(request=requests, chunk=st.integers(1, 40), token=st.integers(0, 50))
    def advance(self, request, chunk, token):
        if request.request_id not in self.live:
            return
        if request.num_computed_tokens == request.num_tokens:
            request.append_output_token_ids(token)  # a decode: the sampled token joins the sequence
        remaining = request.num_tokens - request.num_computed_tokens
        self.allocate(request, min(chunk, remaining))

    @rule(request=consumes(requests))
    def free(self, request):
        if self.live.pop(request.request_id, None) is not None:
            self.manager.free(request)

    def holds_blocks(self) -> bool:
        """Whether a live request holds a block: one whose window handed back every block it had, and whose next
        allocation failed, holds only null entries (the pool then counts every block free)."""
        return any(not block.is_null for request_id in self.live for block in self.manager.get_blocks(request_id))

    @rule()
    def reset_prefix_cache(self):
        in_use = self.holds_blocks()
        assert self.manager.reset_prefix_cache() is not in_use
        if not in_use:
            assert not self.manager.block_pool.cached_block_hash_to_block

    @rule()
    def restore_free_order(self):
        in_use = self.holds_blocks()
        pool = self.manager.block_pool
        assert pool.restore_free_order() is not in_use
        if not in_use:  # a fresh pool's order: every usable block, by id (cached ones stay cached)
            assert [block.block_id for block in pool.free_block_queue] == list(range(1, pool.num_blocks))

    @invariant()
    def block_invariants_hold(self):
        if not hasattr(self, "manager"):
            return
        check_kv_invariants(self.manager)
        assert set(self.manager.req_to_blocks) == set(self.live)
        for request in self.live.values():
            blocks = self.manager.get_blocks(request.request_id)
            assert len(blocks) * self.block_size >= request.num_computed_tokens
            # Every computed position the next query may read is in a real block holding its token.
            for position in range(self.first_visible(request), request.num_computed_tokens):
                block = blocks[position // self.block_size]
                assert self.contents[block.block_id][position % self.block_size] == request.all_token_ids[position]

    def teardown(self):
        if hasattr(self, "manager"):
            for request in self.live.values():
                self.manager.free(request)
            check_kv_invariants(self.manager)
            assert self.manager.num_free_blocks == self.manager.num_usable_blocks


def consumes_nothing(request):
    """A request that could not be admitted still enters the bundle; later rules skip it."""
    return request


KVCacheMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestKVCacheStateMachine = KVCacheMachine.TestCase
