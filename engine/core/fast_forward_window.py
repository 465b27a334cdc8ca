"""What a sliding window changes in a decode fast-forward (engine/core/decode_fast_forward.py).

Two things differ from full attention, and both are fixed before the run starts (with a hybrid KV cache, for
each windowed group: engine/core/fast_forward_block_runs.py's ``GroupedPlannedBlockRuns``):
- A decode after ``c`` computed tokens reads ``min(c + 1, window)`` keys (the simulator's
  ``decode_context_tokens``, sim/cost_models/step_batch.py), not ``c + 1``.
- The KV-cache manager hands back a request's blocks that left its window
  (``KVCacheManager.free_blocks_out_of_window``), but only where an ordinary step reaches
  ``allocate_slots`` for the request: the scheduler's inlined decode fast path bypasses it unless the token
  the decode computes starts a block or, with prefix caching, ends one. So a request's hand-backs are lazy,
  at those steps only, and each hands back every block before ``first_needed_block`` of its computed tokens.
"""

from __future__ import annotations

from engine.core.request import Request


def hand_back_steps(manager, request: Request, context: int, last_step: int) -> list[int]:
    """The steps 0..``last_step`` of a decode run from ``context`` computed tokens in which an ordinary step's
    ``allocate_slots`` hands back blocks of the request, in order. In step j it runs with ``context + j`` tokens
    computed (the scheduler advances the count after it) and hands back up to ``first_needed_block(context + j)``;
    its cap at the cached blocks never binds here (see PlannedBlockRuns._hand_back)."""
    block_size = manager.block_size
    first_allocation = (-context) % block_size
    call_steps = range(first_allocation, last_step + 1, block_size)
    if manager.enable_caching and block_size > 1:
        fills = range((first_allocation - 1) % block_size, last_step + 1, block_size)
        call_steps = sorted((*call_steps, *fills))
    skipped = manager.num_skipped_block[request.request_id]
    steps = []
    first_needed_block = manager.first_needed_block
    for step in call_steps:
        first_needed = first_needed_block(context + step)
        if first_needed > skipped:
            steps.append(step)
            skipped = first_needed
    return steps


class PlannedDecodeContext:
    """``decode_context_tokens`` of each planned step: the sum over the step's requests of the keys each decode
    reads, ``context + step + 1``, or at most ``window`` of them. Kept as the requests still below the window
    (their count and the sum of their ``context + 1``) and the count of those that reached it, so that a step
    costs the requests that leave or reach the window in it, not every request."""

    def __init__(self, context_lengths: list[int], window: int | None) -> None:
        self._contexts = context_lengths
        self._window = window
        self._num_growing = len(context_lengths)
        self._growing_sum = sum(context_lengths) + len(context_lengths)
        self._num_full = 0
        self._full = [False] * len(context_lengths)
        self._gone = [False] * len(context_lengths)
        # Request i reads the whole window from step window - context_i - 1 on: longest contexts first.
        self._by_full_step = [] if window is None else sorted(range(len(context_lengths)),
                                                              key=context_lengths.__getitem__, reverse=True)
        self._next_full = 0

    def leave(self, index: int) -> None:
        """Request ``index`` finished: no later step reads its keys."""
        self._gone[index] = True
        if self._full[index]:
            self._num_full -= 1
        else:
            self._num_growing -= 1
            self._growing_sum -= self._contexts[index] + 1

    def at(self, step: int) -> int:
        """The figure of step ``step``; call with 0, 1, 2, ... in order, after the leavers of earlier steps."""
        order, contexts = self._by_full_step, self._contexts
        while self._next_full < len(order) and self._window - contexts[order[self._next_full]] - 1 <= step:
            index = order[self._next_full]
            self._next_full += 1
            if not self._gone[index]:
                self._full[index] = True
                self._num_growing -= 1
                self._growing_sum -= contexts[index] + 1
                self._num_full += 1
        return self._growing_sum + step * self._num_growing + (self._num_full * self._window if self._num_full else 0)
