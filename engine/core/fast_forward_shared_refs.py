"""The shared block references a decode fast-forward's steps will report, planned before the pool is touched.

``BlockPool.num_shared_refs`` (block-table entries pointing at a block another request holds too) is what
the simulator's ``shared_context_tokens`` reads. In a decode run no block gains a holder (the run's new
blocks are private): blocks only lose holders, when a request finishes or a sliding window hands blocks
back. A block held by ``r`` requests adds ``max(r - 1, 0)``, so the figure after some losses depends only
on how many holders each block lost, not on their order within a phase.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.core.free_block_queue import KVCacheBlock


class PlannedSharedRefs:
    """``num_shared_refs`` through the run, from the pool as it stands (``ref_cnt`` of every block is the
    value before the run until ``apply``) and the holders each block lost in the planned steps."""

    def __init__(self, pool, windowed: bool) -> None:
        self.total = pool.num_shared_refs
        self._lost: dict[int, int] = {}  # block id -> holders lost in the planned steps
        # Without a window a request's shared blocks lead its table (sharing comes from prefix-cache hits, and
        # every holder of a block holds the blocks before it); a window breaks that: a request may have handed
        # back the start of what another still holds.
        self._shared_lead = not windowed

    def release(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Each of ``blocks`` (blocks held before the run) loses one holder."""
        if not self.total:
            return  # no block has two holders, and none can get them back
        lost = self._lost
        for block in blocks:
            block_id = block.block_id
            holders = block.ref_cnt - lost.get(block_id, 0)
            if holders > 1:
                self.total -= 1
            lost[block_id] = lost.get(block_id, 0) + 1

    def free(self, table: list[KVCacheBlock], first: int) -> None:
        """A request finished holding ``table[first:]`` of its table as it stood before the run (its blocks
        allocated in the run are private)."""
        if not self.total:
            return
        if not self._shared_lead:
            self.release(table[first:])
            return
        lost = self._lost
        for block in table[first:]:
            block_id = block.block_id
            holders = block.ref_cnt - lost.get(block_id, 0)
            if holders < 2:
                break  # no later block of the table has another holder
            self.total -= 1
            lost[block_id] = lost.get(block_id, 0) + 1
