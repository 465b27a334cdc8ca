"""Fast-forwarding decode-only steps: k rounds of ``schedule()`` + ``update_from_output()`` in one call.

When every running request is decoding, nothing waits, no request can stop early, and the pool holds
every block the next k steps allocate, the scheduler's decisions over those k steps are already fixed:
every running request decodes one token per step until it reaches its length cap, then it is freed.
A simulator, whose executor's tokens are known in advance, can then advance the scheduler and the
KV-cache manager through the k steps at once, with Python work proportional to the requests and the
blocks touched instead of requests x steps.

The result is exactly the state k ordinary steps leave behind (tokens, block tables, free-queue order,
prefix-cache entries, KV events, the host tier's order): the pool-changing events of the k steps (a sliding
window's hand-backs, block allocations, blocks filling up and entering the cache, frees of finished requests)
are replayed in the order the ordinary steps would perform them, ``(step, schedule-before-update, running
order)``; engine/core/fast_forward_window.py says what a window changes. A hybrid KV cache's groups each replay
their own allocations, fills and hand-backs, one request's hand-backs first, then group by group, as its
``allocate_slots`` makes them.
tests/core/test_decode_fast_forward.py checks the equivalence on random workloads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from engine.core.fast_forward_block_runs import GroupedPlannedBlockRuns, PlannedBlockRuns
from engine.core.fast_forward_shared_refs import PlannedSharedRefs
from engine.core.fast_forward_window import PlannedDecodeContext, hand_back_steps
from engine.core.request import Request, RequestStatus

EMPTY_MAPPING: Mapping[str, int] = MappingProxyType({})

# Event kinds, in the order one request's events of one step happen in an ordinary step: allocate_slots hands
# back the blocks that left a sliding window before it allocates or fills. A store (a block whose KV the step
# completed, copied to the host tier) precedes every free of its update; stores and frees touch different
# structures, so only the order among stores (running order) matters.
_HAND_BACK, _ALLOCATE, _CACHE, _STORE, _FREE = 0, 1, 2, 3, 4
# With a hybrid KV cache one allocate_slots hands back every windowed group's blocks, then allocates and fills
# group by group: an event's stage orders it before its group, its kind after.
_STAGE = {_HAND_BACK: 0, _ALLOCATE: 1, _CACHE: 1, _STORE: 2, _FREE: 3}
# Phases of a step: schedule() touches the pool for every request before update_from_output frees any.
_SCHEDULE_PHASE, _UPDATE_PHASE = 0, 1


@dataclass(slots=True)
class FastForwardStep:
    """What one fast-forwarded step scheduled (all decodes), and the pool after it."""
    num_decode_reqs: int
    decode_context_tokens: int   # sum of (num_computed_tokens + 1) over the step's requests, each at most the window
    max_seq_len: int
    shared_kv_tokens: int = 0    # SchedulerOutput.num_shared_kv_tokens of the step
    kv_block_runs: int = 0       # SchedulerOutput.num_kv_block_runs of the step


@dataclass(slots=True)
class FastForwardResult:
    num_steps: int
    # Running order at the start; each request decoded num_new_tokens[i] tokens, one per step from step 0.
    requests: list[Request]
    num_new_tokens: list[int]
    # The step (0-based) in which each request produced its last token and was freed, or -1.
    finish_step: list[int]
    # Free blocks after each step (after that step's frees).
    num_free_blocks_after: list[int]
    num_running_after: list[int]


class DecodeFastForward:
    """Plan, then apply, a run of decode-only steps. Build it only through ``try_plan``."""

    def __init__(self, scheduler, token_id: int, token_ids_by_request: Mapping[str, int]) -> None:
        self.scheduler = scheduler
        self.token_id = token_id
        self.token_ids_by_request = token_ids_by_request
        self.requests: list[Request] = list(scheduler.running)
        self.context_lengths = [request.num_computed_tokens for request in self.requests]
        # Request i gets its last token in step remaining_i - 1.
        self.last_steps = [request.max_tokens - len(request.output_token_ids) - 1 for request in self.requests]
        self._order = sorted(range(len(self.requests)), key=self.last_steps.__getitem__)
        self._next_leaver = 0
        self._num_active = len(self.requests)
        manager = scheduler.kv_cache_manager
        # The KV-cache groups whose tables the run extends: a hybrid cache's (engine/core/hybrid_kv_cache_manager.py),
        # else the manager itself.
        self._groups = getattr(manager, "groups", None) or [manager]
        self._context = PlannedDecodeContext(self.context_lengths, manager.sliding_window)
        # Some layers windowed and the others not (Gemma 3): the manager keeps every block, and a step's keys
        # read are the mean over layers of the windowed and the full reads (sim/cost_models/step_batch.py's
        # _windowed_step_features, rounded the same way).
        cache_config = scheduler.cache_config
        self._layer_fraction = cache_config.sliding_window_fraction
        self._windowed_context = (PlannedDecodeContext(self.context_lengths, cache_config.sliding_window)
                                  if cache_config.sliding_window is not None and self._layer_fraction < 1 else None)
        # max_seq_len is not windowed: step_features counts the plain context + 1 of the longest request.
        self._active_max_lengths = sorted(((context + 1, index) for index, context in enumerate(self.context_lengths)),
                                          reverse=True)
        self._manager = manager
        self._block_size = manager.block_size
        self._shared_refs = PlannedSharedRefs(manager.block_pool,
                                              any(group.sliding_window is not None for group in self._groups))
        if len(self._groups) > 1:
            self._runs = GroupedPlannedBlockRuns(manager, self.requests, self.context_lengths, self.last_steps)
            self._group_runs = self._runs.planners
        else:
            self._runs = PlannedBlockRuns(manager, self.requests, self.context_lengths, self.last_steps)
            self._group_runs = [self._runs]

    @classmethod
    def try_plan(cls, scheduler, token_id: int,
                 token_ids_by_request: Mapping[str, int] = EMPTY_MAPPING) -> "DecodeFastForward | None":
        """A plan when the next steps are decode-only and fixed, else None (take ordinary steps). Every
        request samples ``token_id``, but those in ``token_ids_by_request``, which sample their own."""
        running = scheduler.running
        if not running or scheduler.waiting or scheduler.has_pending_outputs():
            return None
        if scheduler.num_speculative_tokens:
            return None  # how many tokens each step brings depends on what the executor accepts
        if scheduler.cache_config.attention_chunk_size is not None:
            return None  # a chunked layer's keys read fall back at every chunk boundary: priced step by step
        if len(running) > scheduler.max_num_batched_tokens:
            return None
        manager = scheduler.kv_cache_manager
        pool = manager.block_pool
        if pool.eviction_policy is not None and pool.free_block_queue.empty.num_free_blocks < 8 * len(running):
            # Under another policy than LRU a run allocates from the empty blocks only (apply): with fewer than a
            # few blocks per request it would be too short to pay for its plan (measured: break-even near 8).
            return None
        block_size = manager.block_size
        caching = manager.enable_caching
        for request in running:
            computed = request.num_computed_tokens
            token = token_ids_by_request.get(request.request_id, token_id)
            if request.num_tokens - computed != 1 or token in request.stop_token_set:
                return None
            # The layout k ordinary steps would extend: exactly the blocks the computed tokens need (a
            # window's null entries among them), and every full block registered.
            if len(manager.req_to_blocks[request.request_id]) != -(-computed // block_size):
                return None
            if caching and manager.num_cached_block[request.request_id] != computed // block_size:
                return None
            if manager.offload is not None and manager.num_offloaded_block.get(request.request_id, 0) \
                    != computed // block_size:
                return None
        return cls(scheduler, token_id, token_ids_by_request)

    def step(self, step_index: int) -> FastForwardStep:
        """The batch of step ``step_index``; call with 0, 1, 2, ... in order, all before ``apply``."""
        # Requests whose last token came in an earlier step have left the batch.
        order, last_steps = self._order, self.last_steps
        while self._next_leaver < len(order) and last_steps[order[self._next_leaver]] < step_index:
            leaver = order[self._next_leaver]
            self._num_active -= 1
            self._context.leave(leaver)
            if self._windowed_context is not None:
                self._windowed_context.leave(leaver)
            # Its tables as they stood before the run (apply changes them), less what a window handed back.
            request_id = self.requests[leaver].request_id
            for group, runs in zip(self._groups, self._group_runs):
                self._shared_refs.free(group.req_to_blocks[request_id], runs.num_skipped(leaver))
            self._runs.free(leaver)
            self._next_leaver += 1
        self._runs.allocate(step_index)
        self._shared_refs.release(self._runs.take_handed_back())
        lengths = self._active_max_lengths
        while lengths and last_steps[lengths[0][1]] < step_index:
            lengths.pop(0)
        active = self._num_active
        decode_context_tokens = self._context.at(step_index)
        if self._windowed_context is not None:
            fraction = self._layer_fraction
            decode_context_tokens = round(fraction * self._windowed_context.at(step_index)
                                          + (1 - fraction) * decode_context_tokens)
        return FastForwardStep(active, decode_context_tokens,
                               (lengths[0][0] + step_index) if lengths else 0,
                               self._shared_refs.total * self._block_size, self._runs.total)

    def apply(self, num_steps: int) -> FastForwardResult:
        """Advance the scheduler through ``num_steps`` steps (fewer if the pool would run short)."""
        scheduler = self.scheduler
        manager = scheduler.kv_cache_manager
        pool = manager.block_pool
        block_size = manager.block_size
        caching = manager.enable_caching
        num_steps = min(num_steps, max(self.last_steps) + 1)
        # Under an eviction policy other than LRU (engine/core/policy_free_queue.py) the run allocates from the empty
        # blocks only, which come first in the LRU queue's order (a block freed in the run with a hash goes to the
        # policy, where no allocation of the run reaches it; one without, to the front, as PlannedBlockRuns plans).
        free = pool.get_num_free_blocks() if pool.eviction_policy is None else pool.free_block_queue.empty.num_free_blocks
        num_steps = self._steps_within_pool(num_steps, free, block_size)
        if num_steps <= 0:
            return FastForwardResult(0, [], [], [], [], [])
        groups = self._groups

        # (step, phase, running index, stage, group, kind, block index or token count): sorting gives the ordinary
        # steps' order.
        events: list[tuple[int, int, int, int, int, int, int]] = []
        num_new_tokens, finish_step = [], []
        for index, request in enumerate(self.requests):
            context = self.context_lengths[index]
            last = min(self.last_steps[index], num_steps - 1)
            for group_index, group in enumerate(groups):
                if group.sliding_window is not None:
                    # The argument is the computed count allocate_slots sees: the tokens are advanced below.
                    for step in hand_back_steps(group, request, context, last):
                        events.append((step, _SCHEDULE_PHASE, index, _STAGE[_HAND_BACK], group_index, _HAND_BACK,
                                       context + step))
                # A new block when the token computed in step j starts one: (context + j) % block_size == 0.
                for step in range((-context) % block_size, last + 1, block_size):
                    events.append((step, _SCHEDULE_PHASE, index, _STAGE[_ALLOCATE], group_index, _ALLOCATE, 0))
                if caching:
                    # A block enters the cache in the step after its last token was sampled.
                    for step in range((-(context + 1)) % block_size, last + 1, block_size):
                        events.append((step, _SCHEDULE_PHASE, index, _STAGE[_CACHE], group_index, _CACHE,
                                       (context + step + 1) // block_size))
            if manager.offload is not None:
                # A block's KV is complete, and goes to the host, in the update of the step computing its last slot.
                for step in range((-(context + 1)) % block_size, last + 1, block_size):
                    events.append((step, _UPDATE_PHASE, index, _STAGE[_STORE], 0, _STORE, context + step + 1))
            finished = self.last_steps[index] < num_steps
            if finished:
                events.append((last, _UPDATE_PHASE, index, _STAGE[_FREE], 0, _FREE, 0))
            num_new_tokens.append(last + 1)
            finish_step.append(last if finished else -1)
            # Tokens first: block hashes are a pure function of the tokens, and the cache events
            # below need the hash of every block that fills during the run.
            tokens = [self.token_ids_by_request.get(request.request_id, self.token_id)] * (last + 1)
            request.output_token_ids.extend(tokens)
            request.all_token_ids.extend(tokens)
            request.num_tokens += last + 1
            request.num_computed_tokens = context + last + 1
            if request.num_tokens >= request.next_hash_boundary:
                request._hash_new_full_blocks()
        events.sort()

        requests = self.requests
        num_free_after: list[int] = []
        num_running_after: list[int] = []
        running = len(requests)
        finished_requests: list[Request] = []
        event_index = 0
        for step in range(num_steps):
            while event_index < len(events) and events[event_index][0] == step:
                _, _, index, _, group_index, kind, block_index = events[event_index]
                request = requests[index]
                request_id = request.request_id
                group = groups[group_index]
                if kind == _HAND_BACK:
                    group.free_blocks_out_of_window_at(request, block_index)
                elif kind == _ALLOCATE:
                    group.append_block(request_id, pool.get_new_blocks(1)[0])
                elif kind == _CACHE:
                    pool.cache_full_blocks(group.block_hashes_of(request), group.req_to_blocks[request_id],
                                           block_index - 1, block_index, request.all_token_ids, block_size)
                    group.num_cached_block[request_id] = block_index
                elif kind == _STORE:
                    manager.offload_computed(request, block_index)
                else:
                    request.status = RequestStatus.FINISHED_LENGTH_CAPPED
                    scheduler._free_request(request)
                    finished_requests.append(request)
                    running -= 1
                event_index += 1
            num_free_after.append(pool.get_num_free_blocks())
            num_running_after.append(running)
        if finished_requests:
            gone = {id(request) for request in finished_requests}
            scheduler.running = [request for request in scheduler.running if id(request) not in gone]
        # Blocks handed out here were never shown to an executor: nothing needs zeroing for them.
        pool.take_newly_allocated_block_ids()
        scheduler.last_step_num_preemptions = 0
        return FastForwardResult(num_steps, requests, num_new_tokens, finish_step, num_free_after, num_running_after)

    def _steps_within_pool(self, num_steps: int, num_free: int, block_size: int) -> int:
        """The longest prefix of the run whose allocations fit the free blocks, not counting frees (finished
        requests, a window's hand-backs): so no allocation reaches a block freed to the queue's back in the run,
        which PlannedBlockRuns relies on."""
        per_step = [0] * num_steps
        for index, context in enumerate(self.context_lengths):
            last = min(self.last_steps[index], num_steps - 1)
            for step in range((-context) % block_size, last + 1, block_size):
                per_step[step] += len(self._groups)  # a block per group
        used = 0
        for step, count in enumerate(per_step):
            used += count
            if used > num_free:
                return step
        return num_steps
