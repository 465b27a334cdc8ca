"""The host tier of the prefix cache (KV offloading, engine/core/kv_offload.py), by example.

The state machine (test_scheduler_state_machine.py) draws a host tier at random and checks the invariants
and every request's tokens; these pin down each step: what goes to the host and when, the lookup past the
GPU's hit, the load, and what is scheduled after it.
"""

from __future__ import annotations

import pytest

from engine.core import CacheConfig, RequestStatus
from engine.core.kv_offload import OffloadedBlocks

from tests.core.helpers import check_scheduler_invariants, expected_tokens, make_core, make_request

PROMPT = list(range(100, 164))  # 64 tokens: 4 full blocks of 16


def _mark_loaded(core, request_id):
    """What the connector's load does: the executor's slots for the loaded tokens now hold KV."""
    scheduler = core.scheduler
    transfers = scheduler.kv_transfers
    request = transfers.loading[request_id]
    manager = scheduler.kv_cache_manager
    blocks = manager.get_blocks(request_id)
    for position in range(request.num_computed_tokens, transfers.load_end[request_id]):
        core.executor.computed_slots.setdefault(blocks[position // manager.block_size].block_id, set()).add(
            position % manager.block_size)
    assert scheduler.finish_kv_load(request_id)


def step(core, results):
    """One step, its outputs gathered into ``results`` (per request id: tokens, finish reason, cached tokens)."""
    result = core.step()
    for output in result.outputs:
        entry = results.setdefault(output.request_id, {"tokens": [], "finish_reason": None})
        entry["tokens"].extend(output.new_token_ids)
        entry["num_cached_tokens"] = output.num_cached_tokens
        if output.finish_reason:
            entry["finish_reason"] = output.finish_reason
    return result.scheduler_output


def run(core, results=None, max_steps=10_000):
    """Step until idle, each load finishing right after the step that started it; the outputs per request
    and every load started."""
    results = {} if results is None else results
    loads = {}
    for _ in range(max_steps):
        if not core.has_work():
            return results, loads
        output = step(core, results)
        if output is not None:
            loads.update(output.kv_loads)
        transfers = core.scheduler.kv_transfers
        for request_id in sorted(set(transfers.loading) - transfers.loaded):
            _mark_loaded(core, request_id)
        check_scheduler_invariants(core.scheduler)
    raise AssertionError("the engine did not finish")


def test_the_host_tier_evicts_the_least_recently_used_block_and_a_lookup_stops_at_the_first_miss():
    tier = OffloadedBlocks(3)
    tier.store([b"a", b"b", b"c"])
    assert tier.lookup([b"a", b"b", b"x", b"c"], 0, 4) == 2  # a and b are now the most recently used
    tier.store([b"d"])  # evicts c, the least recently used
    assert tier.hashes() == [b"a", b"b", b"d"] and tier.num_evicted == 1 and tier.num_stored == 4
    tier.store([b"a"])  # already held: only its place in the order changes
    assert tier.hashes() == [b"b", b"d", b"a"] and tier.num_stored == 4
    assert tier.lookup([b"b", b"d"], 1, 2) == 1
    with pytest.raises(ValueError, match="capacity_blocks"):
        OffloadedBlocks(0)


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_a_bad_host_tier_size_names_the_field(bad):
    with pytest.raises(ValueError, match="cache.num_offload_blocks"):
        CacheConfig(num_offload_blocks=bad)


def test_a_host_tier_needs_prefix_caching():
    with pytest.raises(ValueError, match="cache.num_offload_blocks.*prefix caching"):
        CacheConfig(num_offload_blocks=8, enable_prefix_caching=False)


def test_computed_blocks_reach_the_host_when_their_batch_is_back_and_a_lost_prefix_loads_from_there():
    core = make_core(num_gpu_blocks=24, num_offload_blocks=16, max_num_batched_tokens=32)
    scheduler = core.scheduler
    tier = scheduler.kv_cache_manager.offload
    core.add_request(make_request("a", PROMPT, max_tokens=3))
    core.step()  # the first chunk of 32 tokens: two full blocks
    assert len(tier) == 2
    run(core)
    # 64 prompt tokens and 2 appended outputs whose KV was computed: the 4 prompt blocks reached the host.
    assert len(tier) == 4
    assert scheduler.reset_prefix_cache()  # the GPU loses the prefix; the host keeps it

    core.add_request(make_request("b", PROMPT + [7, 8, 9], max_tokens=4))
    results = {}
    output = step(core, results)
    # No GPU hit; the host holds all 4 blocks of the prefix: they load, nothing is computed meanwhile.
    assert output.kv_loads == {"b": 64} and output.total_num_scheduled_tokens == 0
    request = scheduler.requests["b"]
    assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS and request.num_computed_tokens == 0
    check_scheduler_invariants(scheduler)
    assert step(core, results).total_num_scheduled_tokens == 0  # still loading: passed over
    _mark_loaded(core, "b")
    output = step(core, results)
    # Loaded: only the 3 tokens past the prefix are computed, and the loaded prefix counts as cached.
    assert output.num_scheduled_tokens == {"b": 3} and output.scheduled_new_reqs[0].num_computed_tokens == 64
    assert scheduler.kv_cache_manager.get_computed_blocks(make_request_hashed(core, PROMPT + [1]))[1] == 64
    outputs, _ = run(core, results)
    assert outputs["b"]["tokens"] == expected_tokens(core.executor, "b", PROMPT + [7, 8, 9], 4)
    assert outputs["b"]["num_cached_tokens"] == 64
    manager = scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks and not manager.num_offloaded_block


def test_a_load_longer_than_the_step_budget_continues_in_chunks():
    core = make_core(num_gpu_blocks=24, num_offload_blocks=16, max_num_batched_tokens=16)
    core.add_request(make_request("a", PROMPT, max_tokens=1))
    run(core)
    core.scheduler.reset_prefix_cache()
    prompt = PROMPT[:48] + list(range(900, 940))  # 3 blocks on the host, then 40 new tokens
    core.add_request(make_request("b", prompt, max_tokens=2))
    results = {}
    assert step(core, results).kv_loads == {"b": 48}
    _mark_loaded(core, "b")
    scheduled = [step(core, results).num_scheduled_tokens.get("b") for _ in range(3)]
    assert scheduled == [16, 16, 8]
    outputs, _ = run(core, results)
    assert outputs["b"]["tokens"] == expected_tokens(core.executor, "b", prompt, 2)


def test_a_prompt_the_pool_cannot_hold_whole_now_is_recomputed_instead_of_loaded():
    core = make_core(num_gpu_blocks=9, num_offload_blocks=16, max_num_batched_tokens=64)
    core.add_request(make_request("a", PROMPT, max_tokens=1))
    run(core)
    core.scheduler.reset_prefix_cache()
    core.add_request(make_request("hog", list(range(2000, 2040)), max_tokens=30))
    results = {}
    step(core, results)  # the hog holds 3 of the 8 blocks
    core.add_request(make_request("b", PROMPT + [5] * 40, max_tokens=2))  # 104 tokens: 7 blocks, 5 free
    output = step(core, results)
    # The host holds b's first 64 tokens, but loading needs the whole prompt's blocks: b computes a chunk instead.
    assert not output.kv_loads and output.num_scheduled_tokens == {"hog": 1, "b": 63}
    outputs, loads = run(core, results)
    assert outputs["b"]["tokens"] == expected_tokens(core.executor, "b", PROMPT + [5] * 40, 2)


def test_a_preempted_request_resumes_from_the_host_with_its_outputs():
    # Two requests that the pool cannot hold together to their ends: one is preempted, and its blocks, the
    # prompt's and those its outputs filled, are on the host when it resumes.
    core = make_core(num_gpu_blocks=10, num_offload_blocks=32, max_num_batched_tokens=64)
    prompts = {"long": PROMPT, "other": list(range(3000, 3050))}
    for request_id, prompt in prompts.items():
        core.add_request(make_request(request_id, prompt, max_tokens=40))
    outputs, loads = run(core)
    assert core.scheduler.num_preemptions_total > 0
    assert loads, "the preempted request resumed from the host"
    for request_id, prompt in prompts.items():
        assert outputs[request_id]["tokens"] == expected_tokens(core.executor, request_id, prompt, 40)
    manager = core.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks


def make_request_hashed(core, prompt):
    request = make_request("probe", prompt)
    request.set_block_hasher(core.scheduler.block_hasher)
    return request


@pytest.mark.parametrize("max_tokens", [2, 8])
def test_a_request_preempted_with_a_batch_in_flight_recomputes_instead_of_loading(max_tokens):
    # X is preempted while the batch with its next decode is in flight. Had it started a host load, that token
    # would land on it while it loads: past its length (max_tokens=2: freed, yet still in the queue) or
    # beyond the slots the load reserved (max_tokens=8). (Found by a reviewer's random driver.)
    core = make_core(num_gpu_blocks=7, block_size=4, max_num_batched_tokens=64, long_prefill_token_threshold=8,
                     policy="priority", num_offload_blocks=100)
    scheduler, executor = core.scheduler, core.executor

    def start():
        output = scheduler.schedule()
        return output, executor.execute_model(output)

    core.add_request(make_request("X", list(range(100, 111)), max_tokens=max_tokens, priority=1, arrival_time=0.0))
    for _ in range(2):
        scheduler.update_from_output(*start())  # X: 12 tokens, 2 full blocks on the host
    core.add_request(make_request("Y", list(range(500, 516)), max_tokens=4, priority=0, arrival_time=1.0))
    first = start()  # X's decode in flight, with Y's first chunk
    second = start()  # Y's second chunk needs blocks: X is preempted
    assert "X" in second[0].preempted_req_ids
    core.abort_requests(["Y"])
    scheduler.reset_prefix_cache()  # the GPU loses X's prefix; the host keeps it
    third = start()
    assert not third[0].kv_loads and "X" in third[0].num_scheduled_tokens
    for batch in (first, second, third):
        scheduler.update_from_output(*batch)
        check_scheduler_invariants(scheduler)
    outputs, _ = run(core)
    manager = scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks and not scheduler.requests


def test_an_update_storing_more_blocks_than_the_host_holds_hands_out_one_copy_per_slot():
    # 6 new full blocks into a 3-slot tier in one update: slots are reused within it, and the executor gets only
    # each slot's last block (two copies into one slot in one batch of copies may land in either order).
    core = make_core(num_gpu_blocks=24, num_offload_blocks=3, max_num_batched_tokens=128)
    scheduler = core.scheduler
    core.add_request(make_request("a", list(range(100, 197)), max_tokens=2))  # 97 tokens: 6 full blocks
    step(core, {})
    tier, manager = scheduler.kv_cache_manager.offload, scheduler.kv_cache_manager
    assert len(manager.pending_offload_stores) == 6 and tier.num_evicted == 3
    request = scheduler.requests["a"]
    expected = sorted((manager.get_blocks("a")[index].block_id, tier.slot(request.block_hashes[index]))
                      for index in (3, 4, 5))
    assert sorted(step(core, {}).offload_stores) == expected


def test_a_step_that_fails_forgets_the_host_copies_it_carried():
    core = make_core(num_gpu_blocks=24, num_offload_blocks=16, max_num_batched_tokens=64)
    scheduler = core.scheduler
    core.add_request(make_request("a", PROMPT, max_tokens=1))
    step(core, {})  # the prompt's 4 blocks are stored in this update, copied at the start of the next step
    core.add_request(make_request("b", list(range(700, 720)), max_tokens=1))

    def interrupted(scheduler_output):
        raise KeyboardInterrupt
    execute, core.executor.execute_model = core.executor.execute_model, interrupted
    with pytest.raises(KeyboardInterrupt):
        core.step()
    core.executor.execute_model = execute
    assert len(scheduler.kv_cache_manager.offload) == 0  # never copied: never loaded
    core.abort_requests(["b"])
    scheduler.reset_prefix_cache()
    core.add_request(make_request("c", PROMPT + [1], max_tokens=2))
    outputs, loads = run(core)
    assert not loads and outputs["c"]["tokens"] == expected_tokens(core.executor, "c", PROMPT + [1], 2)
