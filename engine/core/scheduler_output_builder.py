"""The ``SchedulerOutput`` of one step: what the runner needs to run it.

Built by ``Scheduler.schedule`` once it has chosen the step's requests; kept apart from the choosing.
"""

from __future__ import annotations

from engine.core.kv_cache_manager import KVCacheManager
from engine.core.request import Request
from engine.core.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput


def build_scheduler_output(kv_cache_manager: KVCacheManager, running: list[Request], scheduled_new: list[Request],
                           scheduled_resumed: list[Request], scheduled_running: list[Request], running_new_blocks: list,
                           running_computed_before: list[int], num_scheduled_tokens: dict[str, int],
                           preempted: list[Request], finished_req_ids: set[str], num_prefix_query_tokens: int,
                           num_prefix_hit_tokens: int, kv_loads: dict[str, int]) -> SchedulerOutput:
    """Describe the step to the runner, and advance the admitted requests' computed counts.

    The counts in the output are the values *before* this step; advancing them at scheduling time
    (not after the model runs) lets the next schedule() see in-flight work as done, as vLLM does.
    Running requests were advanced in phase 1 already.
    """
    new_reqs_data = []
    for request in scheduled_new:
        new_reqs_data.append(NewRequestData(
            request.request_id, request.prompt_token_ids, request.sampling_params,
            kv_cache_manager.get_block_ids(request.request_id), request.num_computed_tokens,
            request.eos_token_id, request.lora_request, request.pooling_params, request.mm_features))
        request.num_computed_tokens += num_scheduled_tokens[request.request_id]

    # Running requests, then resumed ones; built with comprehensions, this runs for every request.
    resumed = scheduled_resumed
    cached = CachedRequestData(
        req_ids=[request.request_id for request in scheduled_running]
        + [request.request_id for request in resumed],
        resumed_from_preemption=[False] * len(scheduled_running) + [True] * len(resumed),
        new_block_ids=[_block_ids(blocks) if blocks else None for blocks in running_new_blocks]
        + [kv_cache_manager.get_block_ids(request.request_id) for request in resumed],
        num_computed_tokens=running_computed_before + [request.num_computed_tokens for request in resumed],
        num_output_tokens=[len(request.output_token_ids) for request in scheduled_running]
        + [len(request.output_token_ids) for request in resumed],
        resumed_token_ids={request.request_id: list(request.all_token_ids) for request in resumed},
    )
    for request in resumed:
        request.num_computed_tokens += num_scheduled_tokens[request.request_id]

    num_common_prefix_blocks = (kv_cache_manager.get_num_common_prefix_blocks(running[0].request_id, len(running))
                                if running else 0)
    return SchedulerOutput(
        scheduled_new_reqs=new_reqs_data,
        scheduled_cached_reqs=cached,
        num_scheduled_tokens=num_scheduled_tokens,
        total_num_scheduled_tokens=sum(num_scheduled_tokens.values()),
        num_common_prefix_blocks=num_common_prefix_blocks,
        finished_req_ids=finished_req_ids,
        preempted_req_ids={request.request_id for request in preempted},
        new_block_ids_to_zero=kv_cache_manager.block_pool.take_newly_allocated_block_ids(),
        num_prefix_query_tokens=num_prefix_query_tokens,
        num_prefix_hit_tokens=num_prefix_hit_tokens,
        num_shared_kv_tokens=kv_cache_manager.block_pool.num_shared_refs * kv_cache_manager.block_size,
        num_kv_block_runs=kv_cache_manager.num_block_runs,
        kv_loads=kv_loads,
    )


def _block_ids(blocks):
    """A request's new blocks as ids: a list, or one list per group of a hybrid KV cache (a tuple)."""
    if isinstance(blocks, tuple):
        return tuple([block.block_id for block in group] for group in blocks)
    return [block.block_id for block in blocks]
