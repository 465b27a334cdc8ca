"""The V1-style scheduler: one token budget per step, shared by decodes and prefill chunks.

Each ``schedule()`` (the seed's section 4):
1. Running requests first, in order: each gets the tokens it still lacks (1 for a decode; the rest of
   its prompt for a prefill, cut by ``long_prefill_token_threshold`` and by what is left of the
   budget). When the pool cannot hold them, the scheduler preempts (the last running request under
   FCFS, the lowest-priority / latest-arrived under priority), freeing the victim's blocks and
   putting it back in the waiting queue; it is recomputed from scratch when it resumes.
2. Only if nothing was preempted in this step: waiting requests, in queue order, each starting from
   its longest prefix-cache hit, while the budget, ``max_num_seqs`` and the pool allow; requests whose KV
   loads from elsewhere (another engine, the host tier) wait for it, and requests whose LoRA adapter would
   make the running requests use more than ``max_loras`` adapters are passed over (engine/core/waiting_admission.py).

A chunk that reaches a multimodal item's placeholders needs the item's encoder output: from the encoder cache,
or computed in this step within the encoder budget and the cache's room; else the chunk stops before the item
(engine/core/encoder_cache_manager.py).

Invariants checked by the tests after every step: scheduled tokens <= ``max_num_batched_tokens``;
running requests <= ``max_num_seqs``; every scheduled request holds blocks for
``num_computed_tokens + num_scheduled_tokens`` tokens; a request is in exactly one of running / waiting
/ finished; the running requests use at most ``max_loras`` distinct LoRA adapters.
"""

from __future__ import annotations

from functools import partial
from typing import Iterable

from engine.core.batches_in_flight import BatchesInFlight
from engine.core.block_hash import make_block_hasher
from engine.core.config import CacheConfig, SchedulerConfig
from engine.core.encoder_cache_manager import EncoderCacheManager, finish_encoder_step, plan_encoder_inputs
from engine.core.hybrid_kv_cache_manager import HybridKVCacheManager
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.kv_transfer import KVTransfers
from engine.core.outputs import EngineCoreOutput, ModelRunnerOutput, SchedulerStats
from engine.core.request import FINISH_REASONS, Request, RequestStatus
from engine.core.request_queue import create_request_queue
from engine.core.scheduler_output import SchedulerOutput
from engine.core.scheduler_output_builder import build_scheduler_output
from engine.core.scheduler_update import apply_model_output
from engine.core.scheduling_policy import policy_rank, victim_rank
from engine.core.spec_decode import SpecDecodingStats
from engine.core.unservable_requests import why_unservable
from engine.core.waiting_admission import Admissions, admit_waiting

_RUNNING = RequestStatus.RUNNING
_PREEMPTED = RequestStatus.PREEMPTED
_LOADING = RequestStatus.WAITING_FOR_REMOTE_KVS
# A step that preempted admits nothing; its lists are never appended to.
NO_ADMISSIONS = Admissions((), ())


class Scheduler:
    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig) -> None:
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.max_num_seqs = scheduler_config.max_num_seqs
        self.max_num_batched_tokens = scheduler_config.max_num_batched_tokens
        self.enable_chunked_prefill = scheduler_config.enable_chunked_prefill
        self.long_prefill_token_threshold = (scheduler_config.long_prefill_token_threshold
                                             if scheduler_config.enable_chunked_prefill else 0)
        self.policy = scheduler_config.policy
        # None under fcfs (the newest running request is the victim); else the ranked policy's victim key
        # (engine/core/scheduling_policy.py).
        rank = policy_rank(self.policy)
        self.victim_rank = None if rank is None else victim_rank(rank)
        self.async_scheduling = scheduler_config.async_scheduling
        self.num_speculative_tokens = scheduler_config.num_speculative_tokens
        self.max_loras = scheduler_config.max_loras
        # Multimodal items' encoder outputs (engine/core/encoder_cache_manager.py); idle for text-only requests.
        self.encoder_cache_manager = EncoderCacheManager(scheduler_config.effective_encoder_cache_size)
        self.encoder_compute_budget = scheduler_config.encoder_compute_budget
        self.disable_chunked_mm_input = scheduler_config.disable_chunked_mm_input
        self.spec_decoding_stats = SpecDecodingStats(self.num_speculative_tokens) \
            if self.num_speculative_tokens else None
        self.max_model_len = scheduler_config.effective_max_model_len(cache_config)
        self.block_size = cache_config.block_size
        if cache_config.kv_cache_groups is not None:
            self.kv_cache_manager = HybridKVCacheManager(
                cache_config.num_gpu_blocks, cache_config.block_size, self.max_model_len,
                cache_config.kv_cache_groups, enable_caching=cache_config.enable_prefix_caching,
                enable_kv_cache_events=cache_config.enable_kv_cache_events,
                num_rollback_tokens=scheduler_config.num_speculative_tokens,
                eviction_policy=cache_config.eviction_policy,
                chunked_groups=cache_config.attention_chunk_size is not None)
        else:
            self.kv_cache_manager = KVCacheManager(
                cache_config.num_gpu_blocks, cache_config.block_size, self.max_model_len,
                enable_caching=cache_config.enable_prefix_caching,
                enable_kv_cache_events=cache_config.enable_kv_cache_events,
                num_offload_blocks=cache_config.num_offload_blocks,
                sliding_window=cache_config.sliding_window if cache_config.frees_out_of_window_blocks else None,
                num_rollback_tokens=scheduler_config.num_speculative_tokens,
                eviction_policy=cache_config.eviction_policy)
        # Every chunk's slots plus the lookahead a draft model writes into (config.py): the same call, with it bound.
        self.allocate_slots = self.kv_cache_manager.allocate_slots if not scheduler_config.num_lookahead_tokens \
            else partial(self.kv_cache_manager.allocate_slots,
                         num_lookahead_tokens=scheduler_config.num_lookahead_tokens)
        self.block_hasher = make_block_hasher(cache_config.block_size) if cache_config.enable_prefix_caching else None
        # Disaggregated prefill and decode: loads and sends in flight (engine/core/kv_transfer.py).
        self.kv_transfers = KVTransfers(self.kv_cache_manager)
        self.requests: dict[str, Request] = {}
        self.waiting = create_request_queue(rank, count_adapters=self.max_loras > 0)
        self.running: list[Request] = []
        # Ids finished since the last schedule(): the next SchedulerOutput tells the runner to drop them.
        self.finished_req_ids: set[str] = set()
        # Outputs for requests that ended outside update_from_output (ignored at admission, aborted).
        self._pending_outputs: list[EngineCoreOutput] = []
        self.num_preemptions_total = 0
        self.last_step_num_preemptions = 0
        # Batches scheduled and not yet updated: more than one only behind a batch queue (pipeline parallelism).
        self.batches_in_flight = BatchesInFlight()

    # ------------------------------------------------------------------ requests in and out

    def add_request(self, request: Request) -> None:
        """Queue a request, or finish it at once as IGNORED if it could never be served."""
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in the scheduler")
        if request.request_id in self.kv_transfers.sending:
            # Its blocks are still held (keyed by id) for the decode engine: a second request of that id would
            # take them as its own, and finish_kv_send would then free a live request's blocks.
            raise ValueError(f"request_id {request.request_id!r} still holds blocks being sent to a decode engine")
        if (request.do_remote_prefill or request.do_remote_decode) and self.cache_config.kv_cache_groups is not None:
            # A transfer moves one block table; a hybrid KV cache has one per group (not built: vLLM's connectors
            # took the hybrid manager on later too).
            raise ValueError(f"request {request.request_id!r}: KV transfer between engines is not supported with a "
                             "hybrid KV cache (cache.kv_cache_groups)")
        if request.sampling_params.n != 1:
            # The front ends fan n out into n requests (engine/parallel_sampling.py); a core request that still
            # says n > 1 would silently produce one completion.
            raise ValueError(f"request {request.request_id!r}: the core takes n = 1, got "
                             f"n={request.sampling_params.n}; fan it out with engine.parallel_sampling")
        if request.mm_features and (request.do_remote_prefill or request.do_remote_decode
                                    or self.cache_config.num_offload_blocks):
            # A loaded prompt's last chunk may start inside an item, whose encoder output no engine here computed.
            raise ValueError(f"request {request.request_id!r}: multimodal items (mm_features) are not supported with "
                             "KV transfer between engines or KV offloading")
        if request.lora_request is not None and not self.max_loras:
            raise ValueError(f"request {request.request_id!r} names LoRA adapter {request.lora_request.lora_name!r} "
                             f"but LoRA is off (scheduler.max_loras=0)")
        reason = why_unservable(self, request)
        if reason is not None:
            request.status = RequestStatus.FINISHED_IGNORED
            request.status_message = reason
            self._pending_outputs.append(EngineCoreOutput(request.request_id, [], "ignored",
                                                          status_message=reason))
            return
        # The effective output cap: the user's max_tokens and the room left under the length limit.
        room = self.max_model_len - request.num_prompt_tokens
        request.max_tokens = room if request.max_tokens is None else min(request.max_tokens, room)
        if self.block_hasher is not None and request.block_hasher is not self.block_hasher:
            request.set_block_hasher(self.block_hasher)
        self.requests[request.request_id] = request
        self.waiting.add_request(request)

    def finish_requests(self, request_ids: str | Iterable[str],
                        finished_status: RequestStatus = RequestStatus.FINISHED_ABORTED) -> None:
        """End requests from outside the step loop (aborts). Unknown or finished ids are ignored."""
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        if not RequestStatus.is_finished(finished_status):
            raise ValueError(f"finished_status must be a finished status, got {finished_status!r}")
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None:
                continue
            if request.status == _RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove_request(request)
                if request.status == _LOADING:
                    self.kv_transfers.drop(request)
            request.status = finished_status
            self._free_request(request)
            self._pending_outputs.append(EngineCoreOutput(request_id, [], FINISH_REASONS[finished_status],
                                                          num_cached_tokens=max(request.num_cached_tokens, 0)))

    def _free_request(self, request: Request) -> None:
        # A prefill engine's disaggregated request keeps its blocks until the decode engine has read them.
        if not self.kv_transfers.hold_for_send(request):
            self.kv_cache_manager.free(request)
        if request.mm_features:
            self.encoder_cache_manager.release_request(request)
        # What batches in flight sampled for it is dropped, should a new request take its id meanwhile.
        self.batches_in_flight.on_end(request.request_id)
        self.finished_req_ids.add(request.request_id)
        del self.requests[request.request_id]

    # ------------------------------------------------------------------ one step

    def schedule(self) -> SchedulerOutput:
        kv_cache_manager = self.kv_cache_manager
        allocate_slots = self.allocate_slots
        running = self.running
        token_budget = self.max_num_batched_tokens
        threshold = self.long_prefill_token_threshold
        num_scheduled_tokens: dict[str, int] = {}
        scheduled_running: list[Request] = []
        running_new_blocks: list = []
        preempted: list[Request] = []
        # Chunks that end before their request's known tokens: they sample nothing.
        partial_prefill_req_ids: set[str] = set()
        # Drafts each decode verifies this step (speculative decoding; engine/core/spec_decode.py).
        scheduled_spec_tokens: dict[str, list[int]] = {}
        encoder = self.encoder_cache_manager
        encoder.begin_step(self.encoder_compute_budget)

        # Phase 1: running requests. Each scheduled request's computed count advances at once (its
        # value before the step is kept in running_computed_before for the SchedulerOutput).
        req_to_blocks = kv_cache_manager.req_to_blocks
        num_cached_block = kv_cache_manager.num_cached_block
        caching = kv_cache_manager.enable_caching
        block_size = self.block_size
        running_computed_before: list[int] = []
        req_index = 0
        async_scheduling = self.async_scheduling
        lookahead = self.scheduler_config.num_lookahead_tokens
        while req_index < len(running) and token_budget > 0:
            request = running[req_index]
            num_computed = request.num_computed_tokens
            num_new_tokens = request.num_tokens - num_computed
            if async_scheduling and request.num_output_placeholders:
                placeholders = request.num_output_placeholders
                if request.num_tokens + placeholders - request.num_prompt_tokens >= request.max_tokens:
                    # The batches in flight bring it to its length: another step would compute a token past it.
                    req_index += 1
                    continue
                num_new_tokens += placeholders
            spec_token_ids = request.spec_token_ids
            if spec_token_ids and num_new_tokens == 1:
                # Its last token and the drafts after it, scored in one pass. (With its batch in flight, some
                # drafts may be computing already: it waits for that batch, as any request in flight does.)
                num_new_tokens += len(spec_token_ids)
            if num_new_tokens == 1:
                # The decode fast path (allocate_slots' own fast path, inlined because it runs for every
                # running request): the last block has room (for the lookahead too) and no block fills, so nothing
                # is allocated (nor encoded: the last prompt token may start an item).
                request_id = request.request_id
                if num_computed + lookahead < len(req_to_blocks[request_id]) * block_size and (
                        not caching or request.num_tokens // block_size == num_cached_block[request_id]) and (
                        not request.mm_features or num_computed >= request.num_prompt_tokens):
                    scheduled_running.append(request)
                    running_new_blocks.append(None)
                    running_computed_before.append(num_computed)
                    request.num_computed_tokens = num_computed + 1
                    num_scheduled_tokens[request_id] = 1
                    token_budget -= 1
                    req_index += 1
                    continue
            if num_new_tokens <= 0:
                # Its last token (and drafts) still being computed by a batch in flight (batches_in_flight.py).
                req_index += 1
                continue
            if 0 < threshold < num_new_tokens:
                num_new_tokens = threshold
            if num_new_tokens > token_budget:
                num_new_tokens = token_budget
            items_to_encode = ()
            if request.mm_features and num_computed < request.num_prompt_tokens:
                num_new_tokens, items_to_encode, newly_held = plan_encoder_inputs(
                    encoder, request, num_computed, num_new_tokens, self.disable_chunked_mm_input)
                if num_new_tokens == 0:
                    # Its next item's encoder output has no room this step (vLLM passes it over too). (It holds
                    # nothing new then: an item held here would lie before the one that cut the chunk.)
                    for identifier in newly_held:
                        encoder.release(request.request_id, identifier)
                    req_index += 1
                    continue
            while True:
                new_blocks = allocate_slots(request, num_new_tokens)
                if new_blocks is not None:
                    break
                if self.victim_rank is not None:
                    victim = max(running, key=self.victim_rank)
                    victim_index = running.index(victim)
                    del running[victim_index]
                    if victim_index < req_index:
                        # Behind the current request: scheduled in this step, or passed over with its token in flight.
                        req_index -= 1
                    if victim.request_id in num_scheduled_tokens:
                        # Already scheduled in this step: its tokens of this step will not be computed.
                        position = scheduled_running.index(victim)
                        victim.num_computed_tokens = running_computed_before[position]
                        del scheduled_running[position]
                        del running_new_blocks[position]
                        del running_computed_before[position]
                        token_budget += num_scheduled_tokens.pop(victim.request_id)
                        partial_prefill_req_ids.discard(victim.request_id)
                        scheduled_spec_tokens.pop(victim.request_id, None)
                else:
                    victim = running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if new_blocks is None:
                break  # the request preempted itself, which released what its plan held
            for feature in items_to_encode:
                encoder.allocate(request.request_id, feature.identifier, feature.length)
            scheduled_running.append(request)
            running_new_blocks.append(new_blocks)
            running_computed_before.append(num_computed)
            if num_computed + num_new_tokens < request.num_tokens:
                partial_prefill_req_ids.add(request.request_id)
            elif spec_token_ids and num_new_tokens > 1:
                # The budget may leave room for only some of the drafts.
                scheduled_spec_tokens[request.request_id] = spec_token_ids[:num_new_tokens - 1]
            request.num_computed_tokens = num_computed + num_new_tokens
            num_scheduled_tokens[request.request_id] = num_new_tokens
            token_budget -= num_new_tokens
            req_index += 1

        # Phase 2: waiting requests, never in a step that had to preempt (engine/core/waiting_admission.py).
        admissions = NO_ADMISSIONS if preempted else admit_waiting(self, token_budget, num_scheduled_tokens,
                                                                   partial_prefill_req_ids)

        self.last_step_num_preemptions = len(preempted)
        self.num_preemptions_total += len(preempted)
        finished_req_ids, self.finished_req_ids = self.finished_req_ids, set()
        scheduler_output = build_scheduler_output(
            self.kv_cache_manager, self.running, admissions.scheduled_new, admissions.scheduled_resumed,
            scheduled_running, running_new_blocks, running_computed_before, num_scheduled_tokens, preempted,
            finished_req_ids, admissions.num_prefix_query_tokens, admissions.num_prefix_hit_tokens,
            self.kv_transfers.take_loads_started())
        scheduler_output.partial_prefill_req_ids = partial_prefill_req_ids
        scheduler_output.sliding_window = self.cache_config.sliding_window
        scheduler_output.sliding_window_fraction = self.cache_config.sliding_window_fraction
        scheduler_output.attention_chunk_size = self.cache_config.attention_chunk_size
        scheduler_output.attention_chunk_fraction = self.cache_config.attention_chunk_fraction
        scheduler_output.scheduled_spec_decode_tokens = scheduled_spec_tokens
        scheduler_output.batch_index = self.batches_in_flight.start()
        if encoder.pending or encoder.held_by_request or encoder.evicted:
            finish_encoder_step(encoder, self.requests, scheduler_output)
        if kv_cache_manager.offload is not None:
            requests = self.requests
            # Up to the last known token: a draft's position holds a verified token's KV only if it is accepted.
            scheduler_output.offload_computed_tokens = {
                request_id: requests[request_id].num_computed_tokens - len(scheduled_spec_tokens.get(request_id, ()))
                for request_id in num_scheduled_tokens}
            scheduler_output.offload_stores = kv_cache_manager.take_offload_stores()
            scheduler_output.offload_loads = self.kv_transfers.take_offload_loads_started()
        if async_scheduling:
            # Each request this batch samples for has one more token in flight.
            requests = self.requests
            for request_id in num_scheduled_tokens:
                if request_id not in partial_prefill_req_ids:
                    requests[request_id].num_output_placeholders += 1
        return scheduler_output

    def _preempt(self, request: Request) -> None:
        """Recompute preemption: drop the request's KV and send it back to wait."""
        self.kv_cache_manager.free(request)
        if request.mm_features:
            self.encoder_cache_manager.release_request(request)
        # Its batches in flight still bring their tokens while it waits (batches_in_flight.py).
        self.batches_in_flight.on_preempt(request.request_id)
        request.status = _PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = []  # proposed after a token whose KV is gone; recomputed first
        request.num_preemptions += 1
        self.waiting.prepend_request(request)

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Append sampled tokens, apply stop conditions, free finished requests (the seed's 8.1):
        engine/core/scheduler_update.py."""
        return apply_model_output(self, scheduler_output, model_runner_output)

    def remove_stopped(self, stopped: list[Request], stopped_waiting: list[Request] = ()) -> None:
        """Take requests that stopped in an update out of the running list (or, preempted ones stopped by a
        token their batch in flight brought, out of the waiting queue) and free them."""
        if stopped:
            stopped_ids = {id(request) for request in stopped}
            self.running = [request for request in self.running if id(request) not in stopped_ids]
        for request in stopped_waiting:
            self.waiting.remove_request(request)
        for request in (*stopped, *stopped_waiting):
            self._free_request(request)

    def finish_kv_load(self, request_id: str) -> bool:
        """A remote prefill's KV has arrived (vLLM: the connector's finished_recving); the next schedule()
        takes the request before any other waiting one. False if it was aborted meanwhile."""
        return self.kv_transfers.finish_load(request_id)

    def finish_kv_send(self, request_id: str) -> bool:
        """The decode engine has read a finished request's KV (vLLM: finished_sending): free its blocks."""
        return self.kv_transfers.finish_send(request_id)

    def has_kv_transfers_in_flight(self) -> bool:
        return self.kv_transfers.in_flight()

    def take_pending_outputs(self) -> list[EngineCoreOutput]:
        """Outputs of requests that ended between steps (for drivers that skip an empty step)."""
        outputs, self._pending_outputs = self._pending_outputs, []
        return outputs

    # ------------------------------------------------------------------ inspection

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def has_pending_outputs(self) -> bool:
        return bool(self._pending_outputs)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def reset_prefix_cache(self) -> bool:
        return self.kv_cache_manager.reset_prefix_cache()

    def make_stats(self) -> SchedulerStats:
        prefix_stats = self.kv_cache_manager.make_prefix_cache_stats()
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            kv_cache_usage=self.kv_cache_manager.usage,
            num_preempted_reqs=self.last_step_num_preemptions,
            prefix_cache_queries=prefix_stats.queries,
            prefix_cache_hits=prefix_stats.hits,
            spec_decoding=self.spec_decoding_stats.to_dict() if self.spec_decoding_stats is not None else None,
        )
