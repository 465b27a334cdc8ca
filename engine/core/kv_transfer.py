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
  A loaded request is scheduled before any other waiting request (``loaded_requests``, ``take``), under the priority
  policy too. vLLM takes it when its turn in the queue comes, usually at the head. But a request
  preempted meanwhile goes ahead of it, and if that request needs the blocks the loaded one holds,
  neither would ever run; taking loaded requests in queue order and looking past a blocked head is not
  enough either (the state machine found a head that resumes, takes the whole token budget and preempts
  itself again, for ever). A loaded request needs one token and no new block, so going first costs
  little.

A host-memory tier of the prefix cache (KV offloading, engine/core/kv_offload.py) loads through the same
states: a waiting request whose prefix misses the GPU's cache but hits the host's gets blocks for its whole
prompt and waits while the hit blocks load (``start_offload_load``); once loaded, it is scheduled first with
the rest of its prompt (chunked as usual), like a remote prefill but with more than one token left.
(vLLM allocates only the loaded blocks; holding the whole prompt's keeps a loaded request from ever waiting
for blocks while it holds some, the case that livelocked above.)

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
        # Each loading request's computed tokens once its load is done (a remote prefill: all but the last).
        self.load_end: dict[str, int] = {}
        # Host-tier loads the last schedule() started: request id -> (host slot, GPU block id) of each block.
        self.offload_loads_started: dict[str, list[tuple[int, int]]] = {}
        # Loading requests that were preempted before: they resume once loaded (the runner gets their whole sequence).
        self.resuming: set[str] = set()

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
        # A later preemption recomputes the request here: its KV is loaded once.
        request.do_remote_prefill = False
        self._start(request, num_hit_tokens, request.num_tokens - 1, num_remote_tokens)
        return num_hit_tokens

    def start_offload_load(self, request: Request, computed_blocks: list, num_hit_tokens: int,
                           num_offload_tokens: int) -> bool:
        """Allocate blocks for the whole prompt of a request whose next ``num_offload_tokens`` after its GPU hit
        are in the host tier, and start loading them; False (nothing changed) when the pool cannot hold it."""
        manager = self.kv_cache_manager
        if manager.allocate_slots(request, request.num_tokens - num_hit_tokens, num_hit_tokens, computed_blocks,
                                  delay_cache_blocks=True) is None:
            return False
        self._start(request, num_hit_tokens, num_hit_tokens + num_offload_tokens, num_offload_tokens)
        block_size = manager.block_size
        first, end = num_hit_tokens // block_size, (num_hit_tokens + num_offload_tokens) // block_size
        blocks, slot = manager.get_blocks(request.request_id), manager.offload.slot
        self.offload_loads_started[request.request_id] = [
            (slot(request.block_hashes[index]), blocks[index].block_id) for index in range(first, end)]
        return True

    def _start(self, request: Request, num_hit_tokens: int, load_end: int, num_load_tokens: int) -> None:
        if request.status == RequestStatus.PREEMPTED:
            self.resuming.add(request.request_id)
        request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        request.num_computed_tokens = num_hit_tokens
        self.loading[request.request_id] = request
        self.load_end[request.request_id] = load_end
        self.loads_started[request.request_id] = num_load_tokens

    def finish_load(self, request_id: str) -> bool:
        """The executor reports a load done; False if the request is no longer loading (aborted)."""
        if request_id not in self.loading:
            return False
        self.loaded.add(request_id)
        return True

    def loaded_requests(self) -> list[Request]:
        """The requests whose KV has arrived, in the order their loads started."""
        return [request for request_id, request in self.loading.items() if request_id in self.loaded]

    def take(self, request: Request) -> None:
        """Make a loaded request an ordinary waiting (or preempted) one: its loaded tokens computed, their blocks
        in the prefix cache. It holds slots for its whole prompt already: scheduling the rest allocates no block."""
        request_id = request.request_id
        self.loaded.discard(request_id)
        del self.loading[request_id]
        request.num_computed_tokens = self.load_end.pop(request_id)
        self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)
        if request_id in self.resuming:
            self.resuming.discard(request_id)
            request.status = RequestStatus.PREEMPTED
        else:
            request.status = RequestStatus.WAITING

    def drop(self, request: Request) -> None:
        """A loading request was aborted: forget its load (its blocks are freed with it)."""
        self.loading.pop(request.request_id, None)
        self.loaded.discard(request.request_id)
        self.loads_started.pop(request.request_id, None)
        self.load_end.pop(request.request_id, None)
        self.resuming.discard(request.request_id)
        self.offload_loads_started.pop(request.request_id, None)

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

    def take_offload_loads_started(self) -> dict[str, list[tuple[int, int]]]:
        started, self.offload_loads_started = self.offload_loads_started, {}
        return started

    def take_loads_started(self) -> dict[str, int]:
        started, self.loads_started = self.loads_started, {}
        return started


# As vLLM's NIXL connector: only a prefill that reached its one token is sent (one that stopped on a stop
# token is the whole answer, and the decode engine never asks for it).
_SENT_STATUSES = (RequestStatus.FINISHED_LENGTH_CAPPED,)
