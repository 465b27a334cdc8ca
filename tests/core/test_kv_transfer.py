"""The scheduler's side of disaggregated prefill and decode (engine/core/kv_transfer.py), by example.

The state machine (test_scheduler_state_machine.py) checks the invariants under random interleavings;
these pin down each step of the protocol as vLLM's scheduler and connector run it.
"""

from __future__ import annotations

import pytest

from engine.core import RequestStatus

from tests.core.helpers import check_scheduler_invariants, expected_tokens, make_core, make_request, run_to_completion

PROMPT = list(range(100, 150))  # 50 tokens: 3 full blocks of 16 and 2 tokens


def _hashed(core, request_id, prompt):
    """A request not added, with its block hashes, for prefix-cache lookups."""
    request = make_request(request_id, prompt)
    request.set_block_hasher(core.scheduler.block_hasher)
    return request


def _mark_loaded(core, request_id):
    """What the connector's load does: the executor's slots for the loaded tokens now hold KV."""
    scheduler = core.scheduler
    request = scheduler.kv_transfers.loading[request_id]
    manager = scheduler.kv_cache_manager
    blocks = manager.get_blocks(request_id)
    for position in range(request.num_computed_tokens, request.num_tokens):
        core.executor.computed_slots.setdefault(blocks[position // manager.block_size].block_id, set()).add(
            position % manager.block_size)
    assert scheduler.finish_kv_load(request_id)


def test_a_remote_prefill_allocates_waits_for_its_kv_then_samples_from_the_last_prompt_token():
    core = make_core(num_gpu_blocks=20)
    scheduler = core.scheduler
    core.add_request(make_request("d", PROMPT, max_tokens=5, do_remote_prefill=True))
    step = core.step()
    # The load starts: blocks for the whole prompt, nothing computed, nothing scheduled.
    assert step.scheduler_output.kv_loads == {"d": 50}
    assert step.scheduler_output.total_num_scheduled_tokens == 0
    request = scheduler.requests["d"]
    assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS and not request.do_remote_prefill
    assert len(scheduler.kv_cache_manager.get_blocks("d")) == 4
    # Its blocks are not in the prefix cache while their KV is in flight: an identical prompt finds nothing.
    twin = _hashed(core, "twin", PROMPT)
    assert scheduler.kv_cache_manager.get_computed_blocks(twin) == ([], 0)
    # Steps before the load ends schedule nothing for it, and start no second load.
    step = core.step()
    assert step.scheduler_output.kv_loads == {} and "d" not in step.scheduler_output.num_scheduled_tokens
    check_scheduler_invariants(scheduler)

    _mark_loaded(core, "d")
    step = core.step()
    # Every prompt token but the last is loaded; the last is computed here for its logits.
    assert step.scheduler_output.num_scheduled_tokens == {"d": 1}
    assert step.scheduler_output.scheduled_new_reqs[0].num_computed_tokens == 49
    assert scheduler.kv_cache_manager.get_computed_blocks(twin)[1] == 48
    results = run_to_completion(core)
    tokens = step.outputs[0].new_token_ids + results["d"]["tokens"]
    assert tokens == expected_tokens(core.executor, "d", PROMPT, 5)
    manager = scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks


def test_a_remote_prefill_loads_only_what_its_own_prefix_cache_lacks():
    core = make_core(num_gpu_blocks=20)
    core.add_request(make_request("local", PROMPT[:40], max_tokens=1))
    run_to_completion(core)
    core.add_request(make_request("d", PROMPT, max_tokens=2, do_remote_prefill=True))
    step = core.step()
    # Two full blocks (32 tokens) of the shared 40 are cached here; the other 18 tokens come over the link.
    assert step.scheduler_output.kv_loads == {"d": 18}
    assert core.scheduler.requests["d"].num_computed_tokens == 32


def test_a_request_aborted_while_loading_frees_its_blocks_and_its_late_load_is_ignored():
    core = make_core(num_gpu_blocks=20)
    scheduler = core.scheduler
    core.add_request(make_request("d", PROMPT, do_remote_prefill=True))
    core.step()
    core.abort_requests("d")
    assert not scheduler.has_kv_transfers_in_flight()
    assert not scheduler.finish_kv_load("d")
    manager = scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks
    check_scheduler_invariants(scheduler)


def test_a_prefill_engines_request_keeps_its_blocks_until_sent_and_leaves_them_cached():
    core = make_core(num_gpu_blocks=20)
    scheduler = core.scheduler
    manager = scheduler.kv_cache_manager
    core.add_request(make_request("p", PROMPT, max_tokens=1, do_remote_decode=True))
    results = run_to_completion(core)
    assert results["p"]["finish_reason"] == "length"
    assert "p" not in scheduler.requests and "p" in scheduler.kv_transfers.sending
    assert manager.num_free_blocks == manager.num_usable_blocks - 4
    assert scheduler.has_kv_transfers_in_flight()
    check_scheduler_invariants(scheduler)
    assert scheduler.finish_kv_send("p")
    assert not scheduler.finish_kv_send("p")
    assert manager.num_free_blocks == manager.num_usable_blocks
    assert manager.get_computed_blocks(_hashed(core, "again", PROMPT))[1] == 48


def test_an_aborted_prefill_is_not_sent():
    core = make_core(num_gpu_blocks=20)
    core.add_request(make_request("p", PROMPT, max_tokens=1, do_remote_decode=True))
    core.abort_requests("p")
    assert not core.scheduler.kv_transfers.sending
    manager = core.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks


def test_a_loaded_request_preempted_later_is_recomputed_here_not_loaded_again():
    # Room for the loaded prompt and a few decode blocks only: a second request forces preemption.
    core = make_core(num_gpu_blocks=7, max_num_batched_tokens=64)
    scheduler = core.scheduler
    core.add_request(make_request("d", PROMPT, max_tokens=20, do_remote_prefill=True))
    core.step()
    _mark_loaded(core, "d")
    core.step()
    core.add_request(make_request("other", list(range(900, 930)), max_tokens=20, arrival_time=-1.0, priority=0))
    loads = []
    for _ in range(200):
        if not core.has_work():
            break
        step = core.step()
        loads.append(step.scheduler_output.kv_loads if step.scheduler_output else {})
    assert not any(loads), "a preempted request's KV was loaded a second time"
    assert scheduler.num_preemptions_total >= 1
    manager = scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks


def test_an_id_whose_blocks_are_still_being_sent_is_refused():
    core = make_core(num_gpu_blocks=20)
    core.add_request(make_request("p", PROMPT, max_tokens=1, do_remote_decode=True))
    run_to_completion(core)
    with pytest.raises(ValueError, match="'p'"):
        core.add_request(make_request("p", PROMPT[:10], max_tokens=4))
    check_scheduler_invariants(core.scheduler)
    assert core.scheduler.finish_kv_send("p")
    core.add_request(make_request("p", PROMPT[:10], max_tokens=4))
    run_to_completion(core)
    manager = core.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks


def test_a_prefill_that_stopped_on_a_stop_token_is_not_sent():
    # As vLLM's NIXL connector: only a prefill that reached its one token hands its KV on.
    core = make_core(num_gpu_blocks=20)
    first_token = expected_tokens(core.executor, "p", PROMPT, 1)[0]
    core.add_request(make_request("p", PROMPT, max_tokens=2, stop_token_ids=[first_token], do_remote_decode=True))
    results = run_to_completion(core)
    assert results["p"]["finish_reason"] == "stop"
    assert not core.scheduler.kv_transfers.sending
    manager = core.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks
