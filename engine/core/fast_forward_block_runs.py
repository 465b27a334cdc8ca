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

    With a sliding window, a request's ``allocate_slots`` (reached exactly at its allocations and fills)
    first hands back the blocks before ``first_needed_block`` of its computed tokens: they leave its runs,
    and go where a finished request's would (with prefix caching they are all cached: the back; without,
    the front, as a group in table order, so the oldest is the next one allocated).
    """

    def __init__(self, manager, requests: list[Request], context_lengths: list[int], last_steps: list[int],
                 queue=None, front: list[KVCacheBlock] | None = None) -> None:
        """``queue`` and ``front``: the free queue's iterator and freed-to-front stack that every group of a hybrid
        KV cache shares (``GroupedPlannedBlockRuns``); None: this planner's own."""
        # Everything per request is built lazily: a plan must cost time in proportion to the blocks the
        # run allocates, fills, hands back and frees, not to every block every running request holds.
        self._block_size = block_size = manager.block_size
        self._caching = manager.enable_caching
        self._manager = manager
        self._windowed = manager.sliding_window is not None
        self._pool = manager.block_pool
        self._queue = iter(self._pool.free_block_queue) if queue is None else queue
        # Freed blocks pushed to the queue's front; the last is taken first.
        self._front: list[KVCacheBlock] = [] if front is None else front
        self._requests = requests
        self._new_blocks: dict[int, list[KVCacheBlock]] = {}  # running index -> blocks allocated in the run
        self._fills: dict[tuple[int, int], bool] = {}  # (running index, block index) -> got a hash in the run
        self._runs: dict[int, int] = {}  # runs gained in the run (less those handed back), per running index
        self._num_skipped: dict[int, int] = {}  # leading null entries of each table, once the run changed them
        # Blocks of the tables as they stood at the start that a window handed back since the last
        # ``take_handed_back`` (the run's own blocks are never shared: their holders matter to nobody).
        self._handed_back: list[KVCacheBlock] = []
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

    def num_skipped(self, index: int) -> int:
        """The request's leading null entries as of the events planned so far."""
        skipped = self._num_skipped.get(index)
        if skipped is None:
            return self._manager.num_skipped_block.get(self._requests[index].request_id, 0)
        return skipped

    def events(self, step: int) -> list[tuple[int, int]]:
        """Step ``step``'s (running index, kind) events, in order, of the requests still running."""
        last_steps = self._last_steps
        events = self._by_residue[step % self._block_size]
        if events and any(last_steps[index] < step for index, _ in events):
            events[:] = [event for event in events if last_steps[event[0]] >= step]  # finished requests leave
        return events

    def allocate(self, step: int) -> None:
        """Step ``step``'s hand-backs, allocations and fills (its schedule phase)."""
        block_size = self._block_size
        events = self.events(step)
        windowed = self._windowed
        for index, kind in events:
            if windowed:
                # Once per allocate_slots call: a second event of the request in this step finds nothing to do.
                self._hand_back(index, self._manager.first_needed_block(self._contexts[index] + step))
            if kind == _ALLOCATE:
                self._allocate(index)
            else:
                self._fill(index, (self._contexts[index] + step + 1) // block_size - 1)

    def _block(self, index: int, block_index: int) -> KVCacheBlock:
        table = self._table(index)
        if block_index < len(table):
            return table[block_index]
        return self._new_blocks[index][block_index - len(table)]

    def _hand_back(self, index: int, first_needed: int) -> None:
        """``KVCacheManager.free_blocks_out_of_window``: its cap at the cached (and offloaded) blocks never
        binds in a decode run, which keeps every full block registered (``try_plan``), and
        ``first_needed_block`` of n computed tokens is at most n // block_size."""
        skipped = self.num_skipped(index)
        if first_needed <= skipped:
            return
        table = self._table(index)
        num_blocks = len(table) + len(self._new_blocks.get(index, ()))
        # Runs of blocks[s:] are the run starts in it: s itself, and every block not after its predecessor.
        # Moving s to f < num_blocks drops the starts in (s, f]; to num_blocks, every run.
        lost = 1 if first_needed >= num_blocks else 0
        block = self._block
        for block_index in range(skipped + 1, min(first_needed, num_blocks - 1) + 1):
            if block(index, block_index).block_id != block(index, block_index - 1).block_id + 1:
                lost += 1
        self._runs[index] = self._runs.get(index, 0) - lost
        self.total -= lost
        handed_back = [block(index, block_index) for block_index in range(skipped, first_needed)]
        if not self._caching:
            # Unhashed (no sharing without prefix caching): to the front as a group, oldest first.
            self._front.extend(reversed(handed_back))
        self._handed_back.extend(handed_back[:max(0, len(table) - skipped)])
        self._num_skipped[index] = first_needed

    def take_handed_back(self) -> list[KVCacheBlock]:
        """The starting tables' blocks handed back since the last call (each loses one holder)."""
        handed_back, self._handed_back = self._handed_back, []
        return handed_back

    def _allocate(self, index: int) -> None:
        if self._front:
            block = self._front.pop()  # taken before in this run: its old hash is gone already
        else:
            # Past the pool's capacity the plan is not applied (``_steps_within_pool``): any block will do.
            block = next(self._queue, None) or KVCacheBlock(-2)
        new_blocks = self._new_blocks.setdefault(index, [])
        table = self._table(index)
        if self.num_skipped(index) >= len(table) + len(new_blocks):
            new_run = True  # every entry is null: nothing to follow (block_runs)
        else:
            previous = new_blocks[-1] if new_blocks else table[-1]
            new_run = block.block_id != previous.block_id + 1
        if new_run:
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
        # end, so the group is pushed head first. A window's null entries are no block to free.
        table = self._table(index)
        blocks = table + self._new_blocks.get(index, [])
        fills = self._fills
        for block_index in range(self.num_skipped(index), len(blocks)):
            filled = fills.get((index, block_index))
            hashed = filled if filled is not None else (
                block_index < len(table) and blocks[block_index].block_hash is not None)
            if not hashed:
                self._front.append(blocks[block_index])


class GroupedPlannedBlockRuns:
    """``PlannedBlockRuns`` for a hybrid KV cache: one planner per group, drawing from one free queue in the
    ordinary steps' order. Every group allocates and fills at the same steps (their tables have one length), and
    one request's ``allocate_slots`` first hands back every windowed group's out-of-window blocks, then takes
    each group's new block in group order; a finished request frees group by group (engine/core/
    hybrid_kv_cache_manager.py)."""

    def __init__(self, manager, requests: list[Request], context_lengths: list[int], last_steps: list[int]) -> None:
        queue, front = iter(manager.block_pool.free_block_queue), []
        self.planners = [PlannedBlockRuns(group, requests, context_lengths, last_steps, queue, front)
                         for group in manager.groups]
        self._windowed = [planner for planner in self.planners if planner._windowed]
        self._contexts = context_lengths
        self._block_size = manager.block_size

    @property
    def total(self) -> int:
        return sum(planner.total for planner in self.planners)

    def allocate(self, step: int) -> None:
        for planner in self.planners[1:]:
            planner.events(step)  # each drops its finished requests; the events are group 0's
        for index, kind in self.planners[0].events(step):
            for planner in self._windowed:
                planner._hand_back(index, planner._manager.first_needed_block(self._contexts[index] + step))
            for planner in self.planners:
                if kind == _ALLOCATE:
                    planner._allocate(index)
                else:
                    planner._fill(index, (self._contexts[index] + step + 1) // self._block_size - 1)

    def take_handed_back(self) -> list[KVCacheBlock]:
        return [block for planner in self.planners for block in planner.take_handed_back()]

    def free(self, index: int) -> None:
        for planner in self.planners:
            planner.free(index)
