"""The block-id runs a decode fast-forward's steps will report, planned before the pool is touched.

``KVCacheManager.num_block_runs`` (runs of consecutive physical block ids over the live block tables)
depends on which blocks each step allocates, which the fast-forward only learns when it applies the
steps; the simulator needs each step's figure before, to time it. This planner derives them from the
pool as it stands. tests/core/test_decode_fast_forward.py checks every planned figure against
ordinary steps.
"""

from __future__ import annotations

from engine.core.free_block_queue import KVCacheBlock
from engine.core.request import Request

# Event kinds, in the order one request's events of one step happen (as in decode_fast_forward.py).
_ALLOCATE, _CACHE = 0, 1


class PlannedBlockRuns:
    """The block-id runs (KVCacheManager.num_block_runs) of each planned step, without touching the pool.

    Which block a step allocates follows from the free queue as it stands: the pool holds every block
    of the run without counting frees (``_steps_within_pool``), and a finished request's blocks go
    either to the back of the queue (blocks in the prefix cache: never reached within the run) or to
    its front (blocks without a hash, such as a partly filled tail: taken by the next allocation). With
    prefix caching on, every block that fills gets a hash (copies of cached content too: the pool
    registers them all, as vLLM does). Events run in the ordinary steps' order: frees of step j - 1, then
    step j's allocations and fills by running order, a request's allocation before its fill.
    """

    def __init__(self, manager, requests: list[Request], context_lengths: list[int], last_steps: list[int]) -> None:
        # Everything per request is built lazily: a plan must cost time in proportion to the blocks the
        # run allocates, fills and frees, not to every block every running request holds.
        self._block_size = block_size = manager.block_size
        self._caching = manager.enable_caching
        self._manager = manager
        self._pool = manager.block_pool
        self._queue = iter(self._pool.free_block_queue)
        self._front: list[KVCacheBlock] = []  # freed blocks pushed to the queue's front; the last is taken first
        self._requests = requests
        self._new_blocks: dict[int, list[KVCacheBlock]] = {}  # running index -> blocks allocated in the run
        self._fills: dict[tuple[int, int], bool] = {}  # (running index, block index) -> got a hash in the run
        self._runs: dict[int, int] = {}  # runs gained in the run, per running index
        self.total = manager.num_block_runs
        # Request i allocates when the token it computes starts a block, (context + step) % block_size
        # == 0, and fills a block (it enters the cache) when the token it computes ends one,
        # (context + step + 1) % block_size == 0; both up to its last step. So step j's events are
        # those of the residue class j % block_size, run in (running index, kind) order.
        self._by_residue: list[list[tuple[int, int]]] = [[] for _ in range(block_size)]
        for index, context in enumerate(context_lengths):
            first_allocation = (-context) % block_size
            if first_allocation <= last_steps[index]:
                self._by_residue[first_allocation].append((index, _ALLOCATE))
            first_fill = (-(context + 1)) % block_size
            if self._caching and first_fill <= last_steps[index]:
                self._by_residue[first_fill].append((index, _CACHE))
        for events in self._by_residue:
            events.sort()
        self._contexts = context_lengths
        self._last_steps = last_steps

    def _table(self, index: int) -> list[KVCacheBlock]:
        """The request's block table at the start of the run (unchanged until ``apply``)."""
        return self._manager.req_to_blocks[self._requests[index].request_id]

    def allocate(self, step: int) -> None:
        """Step ``step``'s allocations and fills (its schedule phase)."""
        block_size, last_steps = self._block_size, self._last_steps
        events = self._by_residue[step % block_size]
        if events and any(last_steps[index] < step for index, _ in events):
            events[:] = [event for event in events if last_steps[event[0]] >= step]  # finished requests leave
        for index, kind in events:
            if kind == _ALLOCATE:
                self._allocate(index)
            else:
                self._fill(index, (self._contexts[index] + step + 1) // block_size - 1)

    def _allocate(self, index: int) -> None:
        if self._front:
            block = self._front.pop()  # taken before in this run: its old hash is gone already
        else:
            # Past the pool's capacity the plan is not applied (``_steps_within_pool``): any block will do.
            block = next(self._queue, None) or KVCacheBlock(-2)
        new_blocks = self._new_blocks.setdefault(index, [])
        previous = new_blocks[-1] if new_blocks else self._table(index)[-1]
        if block.block_id != previous.block_id + 1:
            self._runs[index] = self._runs.get(index, 0) + 1
            self.total += 1
        new_blocks.append(block)

    def _fill(self, index: int, block_index: int) -> None:
        table = self._table(index)
        if block_index < len(table) and table[block_index].block_hash is not None:
            return  # registered before the run
        self._fills[(index, block_index)] = True

    def free(self, index: int) -> None:
        """Request ``index`` finished (the update phase of its last step): free it as the manager does."""
        self.total -= self._manager.num_block_runs_of[self._requests[index].request_id] + self._runs.get(index, 0)
        # KVCacheManager.free frees tail first, and the pool puts the blocks without a hash (the
        # request's own; blocks shared with other requests are prefix hits, hashed, and go back) at the
        # queue's front as a group in that order: the tail is reused first. ``_front`` is taken from its
        # end, so the group is pushed head first.
        table = self._table(index)
        blocks = table + self._new_blocks.get(index, [])
        fills = self._fills
        for block_index in range(len(blocks)):
            filled = fills.get((index, block_index))
            hashed = filled if filled is not None else (
                block_index < len(table) and blocks[block_index].block_hash is not None)
            if not hashed:
                self._front.append(blocks[block_index])
