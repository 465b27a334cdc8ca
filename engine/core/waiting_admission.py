"""Phase 2 of ``Scheduler.schedule()``: admitting waiting requests into the step (the seed's section 4.3).

Never in a step whose first phase had to preempt (the pool is short). In order:

1. Requests whose KV has arrived (a disaggregated decode engine's remote prefill: one token left; the host
   tier of the prefix cache: the rest of the prompt) go first, in slots they already hold, in the order their
   loads started (engine/core/kv_transfer.py explains why first).
2. Then the queue from its head, as long as the token budget and the batch have room. A request whose KV is
   still loading is passed over and keeps its place. A remote prefill starts its load; a request whose
   prefix continues on the host past its GPU hit starts loading it (engine/core/kv_offload.py) when the
   pool can hold its whole prompt and no batch in flight still brings it a token. Any other request is admitted with its GPU prefix hit computed and as
   many new tokens as the budget, the long-prefill cut and chunked prefill allow. The first request that
   cannot be admitted (no blocks, or a whole prompt past the budget without chunked prefill) stops the
   queue: later requests never overtake it. So does a request whose chunk must stop before a multimodal item
   whose encoder output has no room in this step (engine/core/encoder_cache_manager.py) and so would compute
   nothing, or would be cut while chunked prefill is off.

With LoRA (``max_loras`` > 0), a request whose adapter is not among the running requests' while they already
use ``max_loras`` adapters is passed over too, keeping its place (vLLM's rule): it would need an adapter slot
the runner does not have, and requests behind it that fit may overtake it. This holds for both steps, so the
running requests never use more than ``max_loras`` adapters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.core.encoder_cache_manager import plan_encoder_inputs
from engine.core.request import Request, RequestStatus

if TYPE_CHECKING:
    from engine.core.scheduler import Scheduler

_RUNNING = RequestStatus.RUNNING
_PREEMPTED = RequestStatus.PREEMPTED
_LOADING = RequestStatus.WAITING_FOR_REMOTE_KVS


@dataclass(slots=True)
class Admissions:
    """What phase 2 admitted: new and resumed requests, and the prefix-cache lookups of first admissions."""
    scheduled_new: list[Request] = field(default_factory=list)
    scheduled_resumed: list[Request] = field(default_factory=list)
    num_prefix_query_tokens: int = 0
    num_prefix_hit_tokens: int = 0

    def record_query(self, scheduler: Scheduler, request: Request, num_hit_tokens: int) -> None:
        scheduler.kv_cache_manager.record_prefix_cache_query(request, num_hit_tokens)
        if request.num_preemptions == 0:
            self.num_prefix_query_tokens += request.num_tokens
            self.num_prefix_hit_tokens += num_hit_tokens


def admit_waiting(scheduler: Scheduler, token_budget: int, num_scheduled_tokens: dict[str, int],
                  partial_prefill_req_ids: set[str]) -> Admissions:
    """Admit what fits of the waiting queue into the step, adding to ``num_scheduled_tokens`` (and to
    ``partial_prefill_req_ids`` the chunks that end before their prompt does)."""
    admissions = Admissions()
    kv_cache_manager = scheduler.kv_cache_manager
    allocate_slots = scheduler.allocate_slots
    waiting, running = scheduler.waiting, scheduler.running
    max_num_seqs = scheduler.max_num_seqs
    threshold = scheduler.long_prefill_token_threshold
    chunked = scheduler.enable_chunked_prefill
    kv_transfers = scheduler.kv_transfers
    offload = kv_cache_manager.offload
    encoder = scheduler.encoder_cache_manager
    # The adapter ids the running requests use (None without LoRA: then no request names one).
    max_loras = scheduler.max_loras
    active_loras = {request.lora_request.lora_int_id for request in running
                    if request.lora_request is not None} if max_loras else None

    def lora_fits(request: Request) -> bool:
        lora = request.lora_request
        return lora is None or lora.lora_int_id in active_loras or len(active_loras) < max_loras

    def admit(request: Request, num_new_tokens: int) -> None:
        running.append(request)
        if active_loras is not None and request.lora_request is not None:
            active_loras.add(request.lora_request.lora_int_id)
        if request.status == _PREEMPTED:
            admissions.scheduled_resumed.append(request)
            # Tokens of its batches still in flight are dropped now (it recomputes from its sequence as of this
            # resume): none is on its way any more.
            request.num_output_placeholders = 0
            scheduler.batches_in_flight.on_resume(request.request_id)
        else:
            admissions.scheduled_new.append(request)
        request.status = _RUNNING
        if request.num_computed_tokens + num_new_tokens < request.num_tokens:
            partial_prefill_req_ids.add(request.request_id)
        if request.num_cached_tokens < 0:
            request.num_cached_tokens = request.num_computed_tokens
        num_scheduled_tokens[request.request_id] = num_new_tokens

    if kv_transfers.loaded:
        for request in kv_transfers.loaded_requests():
            if token_budget <= 0 or len(running) >= max_num_seqs:
                break
            if active_loras is not None and not lora_fits(request):
                continue  # stays loaded, in its slots, until its adapter fits
            num_new_tokens = _chunk(request.num_tokens - kv_transfers.load_end[request.request_id], threshold,
                                    token_budget, chunked)
            if num_new_tokens is None:
                break
            kv_transfers.take(request)
            waiting.remove_request(request)
            # Its loaded blocks hold its prompt; a draft model's lookahead, when the pool has no room for it, waits
            # for the next step (nothing runs a draft model beside KV transfers).
            if allocate_slots(request, num_new_tokens) is None \
                    and kv_cache_manager.allocate_slots(request, num_new_tokens) is None:
                raise RuntimeError(f"{request}: its loaded blocks hold no slot for the rest of its prompt")
            admit(request, num_new_tokens)
            token_budget -= num_new_tokens

    # Requests whose KV is still loading, and those whose load starts now: passed over, back at the head after.
    skipped: list[Request] = []
    # With every adapter slot taken, only a request on the base model or on a running adapter can be admitted;
    # when the queue holds none (it counts them: request_queue.py), scanning it would pass over every request
    # and put each back where it was.
    if active_loras is not None and len(active_loras) >= max_loras \
            and not waiting.holds_base_or_adapter_of(active_loras):
        return admissions
    while waiting and token_budget > 0 and len(running) < max_num_seqs:
        request = waiting.peek_request()
        if request.status == _LOADING or active_loras is not None and not lora_fits(request):
            skipped.append(waiting.pop_request())
            continue
        if request.do_remote_prefill:
            num_hit_tokens = kv_transfers.start_load(request)
            if num_hit_tokens is None:
                break
            skipped.append(waiting.pop_request())
            admissions.record_query(scheduler, request, num_hit_tokens)
            continue
        computed_blocks, num_hit_tokens = kv_cache_manager.get_computed_blocks(request)
        # Not for a preempted request whose batches in flight may still append tokens: a load reserves slots for
        # the tokens it has now, and one appended while it loads would have none (it recomputes instead).
        if offload is not None and not scheduler.batches_in_flight.may_bring_tokens(request.request_id):
            num_offload_tokens = kv_cache_manager.offloaded_hit_tokens(request, num_hit_tokens)
            if num_offload_tokens and kv_transfers.start_offload_load(request, computed_blocks, num_hit_tokens,
                                                                      num_offload_tokens):
                skipped.append(waiting.pop_request())
                admissions.record_query(scheduler, request, num_hit_tokens)
                continue
        num_new_tokens = _chunk(request.num_tokens - num_hit_tokens, threshold, token_budget, chunked)
        if num_new_tokens is None:
            break
        items_to_encode = ()
        if request.mm_features:
            wanted = num_new_tokens
            num_new_tokens, items_to_encode, newly_held = plan_encoder_inputs(
                encoder, request, num_hit_tokens, num_new_tokens, scheduler.disable_chunked_mm_input)
            if num_new_tokens == 0 or (num_new_tokens < wanted and not chunked) or allocate_slots(
                    request, num_new_tokens, num_hit_tokens, computed_blocks) is None:
                for identifier in newly_held:
                    encoder.release(request.request_id, identifier)
                break
            for feature in items_to_encode:
                encoder.allocate(request.request_id, feature.identifier, feature.length)
        elif allocate_slots(request, num_new_tokens, num_hit_tokens, computed_blocks) is None:
            break
        waiting.pop_request()
        admissions.record_query(scheduler, request, num_hit_tokens)
        request.num_computed_tokens = num_hit_tokens
        admit(request, num_new_tokens)
        token_budget -= num_new_tokens

    for request in reversed(skipped):
        waiting.prepend_request(request)
    return admissions


def _chunk(num_new_tokens: int, threshold: int, token_budget: int, chunked: bool) -> int | None:
    """The tokens a waiting request computes this step: cut at the long-prefill threshold and at the budget
    left, or None when the budget cannot hold them and chunked prefill may not split them."""
    if 0 < threshold < num_new_tokens:
        num_new_tokens = threshold
    if num_new_tokens > token_budget:
        if not chunked:
            return None
        num_new_tokens = token_budget
    return num_new_tokens
