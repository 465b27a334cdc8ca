"""Applying a batch's sampled tokens to the scheduler's requests (the seed's section 8.1).

For each request the batch scheduled: append what it sampled, unless the batch computed a chunk in the middle
of the prompt (it samples nothing), the request was aborted, or it was preempted after this batch was
scheduled and resumed since (engine/core/batches_in_flight.py); a preempted request still waiting keeps the
token, as in vLLM. Then the stop conditions; requests that stop are freed, from the running list or the
waiting queue. With async scheduling each applied token was a placeholder.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.core.outputs import EngineCoreOutput, ModelRunnerOutput
from engine.core.request import FINISH_REASONS, Request, RequestStatus
from engine.core.scheduler_output import SchedulerOutput
from engine.core.spec_decode import trim_drafts
from engine.core.stop_conditions import finish_if_stopped

if TYPE_CHECKING:
    from engine.core.scheduler import Scheduler

_PREEMPTED = RequestStatus.PREEMPTED
_RUNNING = RequestStatus.RUNNING


def apply_model_output(scheduler: Scheduler, scheduler_output: SchedulerOutput,
                       model_runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
    outputs = scheduler.take_pending_outputs()
    requests = scheduler.requests
    sampled_token_ids = model_runner_output.sampled_token_ids
    index_of = model_runner_output.req_id_to_index.get
    logprobs = model_runner_output.logprobs
    stopped: list[Request] = []
    # Preempted requests that stop on a token their batch in flight brought while they waited to resume.
    stopped_waiting: list[Request] = []
    batches = scheduler.batches_in_flight
    batch_index = scheduler_output.batch_index
    partial = scheduler_output.partial_prefill_req_ids
    any_changed = batches.any_changed
    async_scheduling = scheduler.async_scheduling
    scheduled_spec = scheduler_output.scheduled_spec_decode_tokens
    speculating = scheduler.num_speculative_tokens > 0
    if scheduler_output.offload_computed_tokens:
        _offload_computed_blocks(scheduler, scheduler_output)
    for request_id in model_runner_output.finished_kv_loads:
        scheduler.finish_kv_load(request_id)
    for request_id in scheduler_output.num_scheduled_tokens:
        request = requests.get(request_id)
        # Aborted after scheduling, or a chunk in the middle of its prefill: nothing to append.
        if request is None or request_id in partial:
            continue
        waiting_to_resume = False
        if any_changed:
            # Preempted, resumed or ended since this batch was scheduled? Only then can it be waiting here,
            # or its token be dropped.
            if batches.dropped(request_id, batch_index):
                continue
            waiting_to_resume = request.status == _PREEMPTED
        if async_scheduling:
            request.num_output_placeholders -= 1
        index = index_of(request_id)
        if index is None:
            continue
        new_token_ids = sampled_token_ids[index]
        finish_reason = None
        if scheduled_spec and request_id in scheduled_spec:
            _verify_drafts(scheduler, request, scheduled_spec[request_id], len(new_token_ids), waiting_to_resume)
        if len(new_token_ids) == 1:
            # The common case, inlined: one token that is neither a stop token nor the last allowed.
            token_id = new_token_ids[0]
            request.output_token_ids.append(token_id)
            request.all_token_ids.append(token_id)
            request.num_tokens += 1
            if request.num_tokens >= request.next_hash_boundary:
                request._hash_new_full_blocks()
            if (token_id in request.stop_token_set or len(request.output_token_ids) >= request.max_tokens) \
                    and finish_if_stopped(request):
                finish_reason = FINISH_REASONS[request.status]
                (stopped_waiting if waiting_to_resume else stopped).append(request)
        elif new_token_ids:
            for count, token_id in enumerate(new_token_ids, 1):
                request.append_output_token_ids(token_id)
                if finish_if_stopped(request):
                    # Tokens sampled after the stop (speculative decoding) are not part of the output, nor are
                    # their entries in a logprobs payload that lists one per token.
                    new_token_ids = new_token_ids[:count]
                    if logprobs and isinstance(logprobs.get(request_id), list):
                        logprobs = {**logprobs, request_id: logprobs[request_id][:count]}
                    finish_reason = FINISH_REASONS[request.status]
                    (stopped_waiting if waiting_to_resume else stopped).append(request)
                    break
        else:
            continue
        if speculating and finish_reason is None and not waiting_to_resume:
            drafts = model_runner_output.spec_token_ids.get(request_id)
            scheduler.spec_decoding_stats.record_proposal(len(drafts) if drafts else 0)
            request.spec_token_ids = trim_drafts(request, drafts, scheduler.num_speculative_tokens,
                                                 scheduler.max_model_len) if drafts else []
        outputs.append(EngineCoreOutput(
            request_id, new_token_ids, finish_reason, request.stop_reason, request.num_cached_tokens,
            None, logprobs.get(request_id) if logprobs else None))
    if stopped or stopped_waiting:
        scheduler.remove_stopped(stopped, stopped_waiting)
    batches.finish(batch_index)
    return outputs


def _verify_drafts(scheduler: Scheduler, request: Request, drafts: list[int], num_sampled: int,
                   waiting_to_resume: bool) -> None:
    """The executor kept ``num_sampled - 1`` of the step's drafts: count them, and take back the computed
    positions of the rejected ones (their KV is stale; engine/core/spec_decode.py). Fewer than 1 or more
    than drafts + 1 tokens would leave positions that no pass computed, or computed ones unclaimed. A request
    preempted since the batch was scheduled has nothing computed to take back."""
    num_drafts = len(drafts)
    if not 1 <= num_sampled <= num_drafts + 1:
        raise RuntimeError(f"request {request.request_id!r}: the executor returned {num_sampled} tokens for a step "
                           f"with {num_drafts} draft tokens (expected 1 to {num_drafts + 1})")
    if not waiting_to_resume:
        request.num_computed_tokens -= num_drafts + 1 - num_sampled
    scheduler.spec_decoding_stats.record(num_drafts, num_sampled - 1)


def _offload_computed_blocks(scheduler: Scheduler, scheduler_output: SchedulerOutput) -> None:
    """The batch is back, its KV computed: copy each request's new full blocks to the host tier
    (engine/core/kv_offload.py), before any request that stopped frees them. Not for a request preempted or
    resumed since the batch was scheduled: its blocks may hold another request's KV by now."""
    requests = scheduler.requests
    batches = scheduler.batches_in_flight
    batch_index = scheduler_output.batch_index
    offload_computed = scheduler.kv_cache_manager.offload_computed
    for request_id, num_computed_tokens in scheduler_output.offload_computed_tokens.items():
        request = requests.get(request_id)
        if request is None or request.status != _RUNNING or batches.dropped(request_id, batch_index):
            continue
        offload_computed(request, num_computed_tokens)
