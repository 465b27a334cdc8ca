"""The scheduler's side of KV transfer between engines: disaggregated prefill and decode.

In a disaggregated deployment (vLLM's ``kv_transfer_config`` with a connector such as NIXL), one engine
computes a prompt's KV and another decodes from it. This file keeps what the scheduler must know about
transfers in flight, in the manner of vLLM's scheduler-side connector; the bytes themselves move in the
executor (the simulator times them, sim/disaggregation.py).

- Prefill engine (``request.do_remote_decode``): the request runs its prompt and one sampled token and
  finishes, but its blocks stay allocated until the decode engine has read them (vLLM's
  ``delay_free_blocks``). ``finish_send`` frees them.
- Decode engine (``request.do_remote_prefill``): when the request reaches the head of the waiting queue,
  the scheduler looks up its local prefix-cache hit and allocates blocks for the rest of the prompt, whose
  KV is then loaded from the prefill engine (``loads_started``). The request waits as
  ``WAITING_FOR_REMOTE_KVS``, still in the waiting queue but skipped; its blocks join the prefix cache only
  once the load is done (``finish_load``). Then it is scheduled with every prompt token but the last
  computed: the last is recomputed for its logits, so the decode engine samples the first output token.
  A loaded request is scheduled before any other waiting request (``take_loaded``), under the priority
  policy too. vLLM takes it when its turn in the queue comes, usually at the head. But a request
  preempted meanwhile goes ahead of it, and if that request needs the blocks the loaded one holds,
  neither would ever run; taking loaded requests in queue order and looking past a blocked head is not
  enough either (the state machine found a head that resumes, takes the whole token budget and preempts
  itself again, for ever). A loaded request needs one token and no new block, so going first costs
  little.

Invariants (checked with the scheduler's):
- a loading request is in the waiting queue and holds blocks for its whole prompt;
- a sending request is no longer in ``scheduler.requests`` and still holds its blocks, which count as a
  live request's in the block reference counts until ``finish_send``;
- every load started is finished or aborted once, and every send once.
"""

from __future__ import annotations

from engine.core.kv_cache_manager import KVCacheManager
from engine.core.request import Request, RequestStatus


class KVTransfers:
    def __init__(self, kv_cache_manager: KVCacheManager) -> None:
        self.kv_cache_manager = kv_cache_manager
        # Decode engine: requests whose KV is loading, and those whose load is done but not yet scheduled.
        self.loading: dict[str, Request] = {}
        self.loaded: set[str] = set()
        # Prefill engine: finished requests whose blocks wait to be read.
        self.sending: dict[str, Request] = {}
        # Loads the last schedule() started: request id -> tokens of KV to load (the executor moves them).
        self.loads_started: dict[str, int] = {}

    def in_flight(self) -> bool:
        """True while a transfer this engine waits on is unfinished (its steps may schedule nothing)."""
        return bool(self.loading) or bool(self.sending)

    def start_load(self, request: Request) -> int | None:
        """Allocate the blocks a remote prefill's KV lands in; the local prefix hit in tokens, or None when
        the pool cannot hold the prompt (the request stays at the head of the queue)."""
        manager = self.kv_cache_manager
        computed_blocks, num_hit_tokens = manager.get_computed_blocks(request)
        num_remote_tokens = request.num_tokens - num_hit_tokens
        if manager.allocate_slots(request, num_remote_tokens, num_hit_tokens, computed_blocks,
                                  delay_cache_blocks=True) is None:
            return None
        request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        request.num_computed_tokens = num_hit_tokens
        # A later preemption recomputes the request here: its KV is loaded once.
        request.do_remote_prefill = False
        self.loading[request.request_id] = request
        self.loads_started[request.request_id] = num_remote_tokens
        return num_hit_tokens

    def finish_load(self, request_id: str) -> bool:
        """The executor reports a load done; False if the request is no longer loading (aborted)."""
        if request_id not in self.loading:
            return False
        self.loaded.add(request_id)
        return True

    def take_loaded(self, limit: int) -> list[Request]:
        """Up to ``limit`` requests whose KV has arrived, in the order their loads started, each made an
        ordinary waiting request with its prompt computed but the last token and its blocks in the prefix
        cache (they hold a slot for that last token already: scheduling it allocates no block)."""
        taken: list[Request] = []
        for request_id, request in self.loading.items():
            if len(taken) >= limit:
                break
            if request_id in self.loaded:
                taken.append(request)
        for request in taken:
            self.loaded.discard(request.request_id)
            del self.loading[request.request_id]
            request.num_computed_tokens = request.num_tokens - 1
            self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)
            request.status = RequestStatus.WAITING
        return taken

    def drop(self, request: Request) -> None:
        """A loading request was aborted: forget its load (its blocks are freed with it)."""
        self.loading.pop(request.request_id, None)
        self.loaded.discard(request.request_id)
        self.loads_started.pop(request.request_id, None)

    def hold_for_send(self, request: Request) -> bool:
        """At a prefill request's normal finish: keep its blocks for the decode engine. False when the
        request is not to be sent (not disaggregated, or aborted / ignored / failed)."""
        if not request.do_remote_decode or request.status not in _SENT_STATUSES:
            return False
        if request.request_id not in self.kv_cache_manager.req_to_blocks:
            # It finished while preempted (on the token a batch in flight brought, batches_in_flight.py): its
            # KV is gone, so there is nothing to send; the decode engine would recompute the prompt.
            return False
        self.sending[request.request_id] = request
        return True

    def finish_send(self, request_id: str) -> bool:
        """The decode engine has read the request's KV: free its blocks (they stay in the prefix cache)."""
        request = self.sending.pop(request_id, None)
        if request is None:
            return False
        self.kv_cache_manager.free(request)
        return True

    def take_loads_started(self) -> dict[str, int]:
        started, self.loads_started = self.loads_started, {}
        return started


# As vLLM's NIXL connector: only a prefill that reached its one token is sent (one that stopped on a stop
# token is the whole answer, and the decode engine never asks for it).
_SENT_STATUSES = (RequestStatus.FINISHED_LENGTH_CAPPED,)
