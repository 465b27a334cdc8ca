"""What a step scheduled, as the cost model and the step trace see it, read from a ``SchedulerOutput``.

Shared by the simulator's executor and the wall-clock driver of real runs, so that a real run's
``steps.parquet`` describes its steps with exactly the features the simulator times them by.
"""

from __future__ import annotations

from engine.core.scheduler_output import SchedulerOutput
from sim.cost_models import StepBatch, StepFeatures
from sim.cost_models.step_batch import sliced_prefill_pairs, step_features


def step_batch(scheduler_output: SchedulerOutput) -> StepBatch:
    """The cost model's view of a step: per scheduled request, new tokens and tokens already cached."""
    num_scheduled_tokens = scheduler_output.num_scheduled_tokens
    scheduled = [num_scheduled_tokens[new.req_id] for new in scheduler_output.scheduled_new_reqs]
    computed = [new.num_computed_tokens for new in scheduler_output.scheduled_new_reqs]
    cached = scheduler_output.scheduled_cached_reqs
    scheduled += [num_scheduled_tokens[request_id] for request_id in cached.req_ids]
    computed += cached.num_computed_tokens
    spec = scheduler_output.scheduled_spec_decode_tokens
    drafts = None
    if spec:  # a request verifies drafts only after its prefill, so only a cached one can
        drafts = [0] * len(scheduler_output.scheduled_new_reqs)
        drafts += [len(spec.get(request_id, ())) for request_id in cached.req_ids]
    return StepBatch(scheduled, computed, scheduler_output.num_shared_kv_tokens, scheduler_output.num_kv_block_runs,
                     drafts, scheduler_output.sliding_window, scheduler_output.sliding_window_fraction,
                     scheduler_output.attention_chunk_size, scheduler_output.attention_chunk_fraction,
                     scheduler_output.encoder_input_lengths or None)


def scheduler_output_features(scheduler_output: SchedulerOutput) -> StepFeatures:
    """``step_features(step_batch(scheduler_output))`` in one pass, without building the batch.

    This runs once per simulated step, so it reads the scheduler's output directly; a test checks it
    against the two-step definition. A sliding-window model's steps take the two-step path (each term
    windowed in ``step_features``).
    """
    if scheduler_output.sliding_window is not None or scheduler_output.attention_chunk_size is not None:
        return step_features(step_batch(scheduler_output))
    num_scheduled_tokens = scheduler_output.num_scheduled_tokens
    cached = scheduler_output.scheduled_cached_reqs
    num_decode_reqs = decode_context_tokens = 0
    num_prefill_reqs = num_prefill_tokens = prefill_context_tokens = prefill_attention_work = 0
    prefill_attention_dense_work = context_prefill_dense_work = prefill_attention_sliced_work = 0
    max_seq_len = 0
    num_spec_tokens = spec_attention_work = num_spec_reqs = spec_context_tokens = 0
    spec = scheduler_output.scheduled_spec_decode_tokens
    pairs = [(num_scheduled_tokens[new.req_id], new.num_computed_tokens) for new in scheduler_output.scheduled_new_reqs]
    for request_id, context in zip(cached.req_ids, cached.num_computed_tokens):
        query = num_scheduled_tokens[request_id]
        if query == 1:
            num_decode_reqs += 1
            decode_context_tokens += context + 1
            if context >= max_seq_len:
                max_seq_len = context + 1
        elif spec and request_id in spec:
            # A verification of drafts (engine/core/spec_decode.py): a decode with more query rows.
            num_drafts = query - 1
            num_decode_reqs += 1
            decode_context_tokens += context + query
            num_spec_tokens += num_drafts
            spec_attention_work += num_drafts * context + num_drafts * query // 2
            num_spec_reqs += 1
            spec_context_tokens += context + query
            if context + query > max_seq_len:
                max_seq_len = context + query
        else:
            pairs.append((query, context))
    for query, context in pairs:
        if query == 1:
            num_decode_reqs += 1
            decode_context_tokens += context + 1
        else:
            num_prefill_reqs += 1
            num_prefill_tokens += query
            prefill_context_tokens += context
            prefill_attention_work += query * context + query * (query + 1) // 2
            prefill_attention_dense_work += query * (context + query)
            if context:
                context_prefill_dense_work += query * (context + query)
            prefill_attention_sliced_work += sliced_prefill_pairs(query, context)
        if context + query > max_seq_len:
            max_seq_len = context + query
    return StepFeatures(
        num_reqs=len(num_scheduled_tokens), num_tokens=scheduler_output.total_num_scheduled_tokens,
        num_prefill_reqs=num_prefill_reqs, num_prefill_tokens=num_prefill_tokens, num_decode_reqs=num_decode_reqs,
        decode_context_tokens=decode_context_tokens, prefill_context_tokens=prefill_context_tokens,
        prefill_attention_work=prefill_attention_work, max_seq_len=max_seq_len,
        prefill_attention_dense_work=prefill_attention_dense_work,
        context_prefill_dense_work=context_prefill_dense_work,
        prefill_attention_sliced_work=prefill_attention_sliced_work,
        shared_context_tokens=scheduler_output.num_shared_kv_tokens, kv_block_runs=scheduler_output.num_kv_block_runs,
        num_spec_tokens=num_spec_tokens, spec_attention_work=spec_attention_work, num_spec_reqs=num_spec_reqs,
        spec_context_tokens=spec_context_tokens, num_encoder_tokens=scheduler_output.num_encoder_tokens,
        encoder_attention_work=sum(length * length for length in scheduler_output.encoder_input_lengths)
        if scheduler_output.encoder_input_lengths else 0)
