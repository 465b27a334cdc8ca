"""The runner's copy of each request, brought up to date with the scheduler's decisions before a step runs.

The scheduler is the source of truth: finished and preempted requests leave the persistent batch, new ones join it
with their per-request state (generator, grammar, adapter, bad words), a request that sat out a step comes back, a
resumed one starts over with the scheduler's copy of its tokens, and a request whose kept output is shorter than what
was sampled (a verification that rejected drafts, a batch in flight) is cut back to it. Blocks the scheduler hands out
anew are zeroed first, so no kernel reads a previous owner's values. The draft model, where there is one, follows
the same requests (spec_decode/draft_model.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.core.scheduler_output import SchedulerOutput
from engine.runner.bad_words import bad_words_token_ids
from engine.runner.mrope_positions import prompt_mrope_positions
from engine.runner.request_state import CachedRequestState, copy_block_ids, extend_block_ids
from engine.runner.sampler import make_generator

if TYPE_CHECKING:
    from engine.runner.model_runner import ModelRunner


def update_states(runner: ModelRunner, scheduler_output: SchedulerOutput) -> None:
    batch = runner.input_batch
    requests = runner.requests
    for req_id in scheduler_output.finished_req_ids:
        requests.pop(req_id, None)  # its grammar matcher, if any, goes with its state
        runner.grammar_req_ids.discard(req_id)
        batch.remove_request(req_id)
        runner.prompt_logprobs.forget(req_id)
        runner.pooling.forget(req_id)
        if runner.draft_model is not None:
            runner.draft_model.forget(req_id)
    for req_id in scheduler_output.preempted_req_ids:
        batch.remove_request(req_id)
    if scheduler_output.new_block_ids_to_zero and runner.kv_caches:
        runner._zero_blocks(scheduler_output.new_block_ids_to_zero)

    scheduled = scheduler_output.num_scheduled_tokens
    # Requests the scheduler skipped this step (token budget exhausted) sit out; their state stays.
    for req_id in [req_id for req_id in batch.req_id_to_index if req_id not in scheduled]:
        batch.remove_request(req_id)

    for new_request in scheduler_output.scheduled_new_reqs:
        params = new_request.sampling_params
        generator = None
        if params.seed is not None and not params.is_greedy:
            generator = make_generator(params.seed, runner.device)
        state = CachedRequestState(
            req_id=new_request.req_id,
            prompt_token_ids=list(new_request.prompt_token_ids),
            sampling_params=params,
            generator=generator,
            block_ids=copy_block_ids(new_request.block_ids),
            num_computed_tokens=new_request.num_computed_tokens,
            output_token_ids=[],
            eos_token_id=new_request.eos_token_id,
            bad_words_token_ids=bad_words_token_ids(runner.tokenizer, params.bad_words) if params.bad_words else None,
            grammar=runner._new_grammar(new_request.req_id, params, new_request.prompt_token_ids),
            lora_request=runner._check_lora(new_request.lora_request),
            pooling_params=runner._check_pooling(new_request.pooling_params),
            mm_features=runner._check_images(new_request.mm_features),
        )
        if runner.mrope_merge_size and state.mm_features:
            state.mrope_positions, state.mrope_delta = prompt_mrope_positions(
                state.num_prompt_tokens, state.mm_features, runner.mrope_merge_size)
        requests[new_request.req_id] = state
        batch.add_request(state)
        if runner.draft_model is not None:
            runner.draft_model.start(new_request.req_id, new_request.num_computed_tokens)

    cached = scheduler_output.scheduled_cached_reqs
    for index, req_id in enumerate(cached.req_ids):
        state = requests[req_id]
        num_computed_tokens = cached.num_computed_tokens[index]
        state.num_computed_tokens = num_computed_tokens
        new_block_ids = cached.new_block_ids[index]
        if cached.resumed_from_preemption[index]:
            # Recomputed from scratch: new block table, and the scheduler's copy of every token.
            state.block_ids = copy_block_ids(new_block_ids or ())
            state.output_token_ids[:] = cached.resumed_token_ids[req_id][state.num_prompt_tokens:]
            if state.grammar is not None:  # the kept output may differ from what this runner sampled
                state.grammar.sync(state.output_token_ids)
            batch.remove_request(req_id)
            batch.add_request(state)
            if runner.draft_model is not None:
                runner.draft_model.start(req_id, num_computed_tokens)
            continue
        if new_block_ids:
            extend_block_ids(state.block_ids, new_block_ids)
        num_output_tokens = cached.num_output_tokens[index]
        if len(state.output_token_ids) > num_output_tokens:
            # The scheduler kept fewer tokens than were sampled (it is the source of truth).
            del state.output_token_ids[num_output_tokens:]
            if state.grammar is not None:
                state.grammar.sync(state.output_token_ids)
            row = batch.req_id_to_index.get(req_id)
            if row is not None:
                batch.truncate_output(row, num_output_tokens)
        row = batch.req_id_to_index.get(req_id)
        if row is None:
            batch.add_request(state)  # back from sitting out a step
        else:
            batch.num_computed_tokens_cpu[row] = num_computed_tokens
            if new_block_ids:
                batch.block_table.append_row(new_block_ids, row)
    batch.condense()
