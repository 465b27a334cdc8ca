"""Examples that pin vLLM-compatible scheduling behaviour."""

from __future__ import annotations

import pytest

from engine.core import ModelRunnerOutput, RequestStatus

from tests.core.helpers import (check_cached_blocks_were_computed, check_scheduler_invariants, expected_tokens,
                                make_core, make_request, run_to_completion)


def scripted_output(scheduler_output, tokens_by_request):
    req_ids = list(scheduler_output.num_scheduled_tokens)
    return ModelRunnerOutput(req_ids, {rid: i for i, rid in enumerate(req_ids)},
                             [list(tokens_by_request.get(rid, [])) for rid in req_ids])


def test_long_prefill_threshold_splits_three_800_token_prompts_400_400_224():
    core = make_core(max_num_batched_tokens=1024, long_prefill_token_threshold=400)
    for index in range(3):
        core.add_request(make_request(f"r{index}", range(index * 1000, index * 1000 + 800)))
    output = core.scheduler.schedule()
    assert output.num_scheduled_tokens == {"r0": 400, "r1": 400, "r2": 224}
    assert output.total_num_scheduled_tokens == 1024
    assert [new.num_computed_tokens for new in output.scheduled_new_reqs] == [0, 0, 0]


def test_stop_token_trims_the_tokens_sampled_after_it():
    core = make_core()
    scheduler = core.scheduler
    scheduler.add_request(make_request("a", range(10), max_tokens=20, stop_token_ids=[42]))
    first = scheduler.schedule()
    outputs = scheduler.update_from_output(first, scripted_output(first, {"a": [5]}))
    assert outputs[0].new_token_ids == [5]
    second = scheduler.schedule()
    # Several tokens in one step (as with speculative decoding): everything after the stop goes.
    outputs = scheduler.update_from_output(second, scripted_output(second, {"a": [7, 42, 9, 11]}))
    assert outputs[0].new_token_ids == [7, 42]
    assert outputs[0].finish_reason == "stop" and outputs[0].stop_reason == 42
    assert not scheduler.requests and scheduler.kv_cache_manager.num_free_blocks == 999


def test_eos_respects_min_tokens_and_ignore_eos():
    core = make_core()
    scheduler = core.scheduler
    scheduler.add_request(make_request("min", range(8), max_tokens=10, min_tokens=2, eos_token_id=2))
    scheduler.add_request(make_request("ignore", range(8), max_tokens=3, ignore_eos=True, eos_token_id=2))
    step = scheduler.schedule()
    outputs = {o.request_id: o for o in scheduler.update_from_output(step, scripted_output(step, {"min": [2], "ignore": [2]}))}
    assert outputs["min"].finish_reason is None  # EOS before min_tokens does not stop
    step = scheduler.schedule()
    outputs = {o.request_id: o for o in scheduler.update_from_output(step, scripted_output(step, {"min": [2], "ignore": [2]}))}
    assert outputs["min"].finish_reason == "stop"
    assert outputs["ignore"].finish_reason is None
    step = scheduler.schedule()
    outputs = {o.request_id: o for o in scheduler.update_from_output(step, scripted_output(step, {"ignore": [2]}))}
    assert outputs["ignore"].finish_reason == "length"


def test_max_model_len_caps_output_length():
    core = make_core(max_model_len=20)
    core.add_request(make_request("a", range(15), max_tokens=100))
    results = run_to_completion(core)
    assert results["a"]["finish_reason"] == "length"
    assert len(results["a"]["tokens"]) == 5


def test_priority_order_with_ties_broken_by_arrival():
    core = make_core(policy="priority", max_num_seqs=1)
    arrivals = [("late-high", 1, 5.0), ("low", 3, 0.0), ("early-high", 1, 1.0), ("mid", 2, 0.5),
                ("same-time-second", 1, 5.0)]
    for request_id, priority, arrival in arrivals:
        core.add_request(make_request(request_id, range(8), max_tokens=1, priority=priority, arrival_time=arrival))
    order = []
    while core.has_work():
        step = core.step()
        if step.scheduler_output:
            order += [new.req_id for new in step.scheduler_output.scheduled_new_reqs]
    assert order == ["early-high", "late-high", "same-time-second", "mid", "low"]


def test_priority_ties_on_arrival_are_broken_by_request_id_not_by_admission_order():
    # vLLM's Request.__lt__: priority, then arrival_time, then request_id (string order).
    core = make_core(policy="priority", max_num_seqs=1)
    for request_id in ["req-b", "req-c", "req-a"]:
        core.add_request(make_request(request_id, range(8), max_tokens=1, priority=0, arrival_time=1.0))
    order = []
    while core.has_work():
        step = core.step()
        if step.scheduler_output:
            order += [new.req_id for new in step.scheduler_output.scheduled_new_reqs]
    assert order == ["req-a", "req-b", "req-c"]


def test_fcfs_preempts_the_last_admitted_and_admits_nothing_in_that_step():
    # 9 usable blocks of 4 tokens: three requests of 12 tokens fill them; decoding needs more.
    core = make_core(num_gpu_blocks=10, block_size=4, max_num_batched_tokens=64)
    scheduler = core.scheduler
    for index in range(3):
        scheduler.add_request(make_request(f"r{index}", range(index * 100, index * 100 + 12), max_tokens=8))
    step = core.step()
    assert set(step.scheduler_output.num_scheduled_tokens) == {"r0", "r1", "r2"}
    scheduler.add_request(make_request("late", range(500, 504), max_tokens=2))
    step = core.step()
    # r0 needs a 4th block: none free, so the last admitted (r2) is preempted; r1 then needs one too
    # and gets r2's freed blocks. Nothing new is admitted in a step that preempted.
    assert step.scheduler_output.preempted_req_ids == {"r2"}
    assert set(step.scheduler_output.num_scheduled_tokens) == {"r0", "r1"}
    assert [r.request_id for r in scheduler.waiting] == ["r2", "late"]  # back at the head of the queue
    r2 = next(iter(scheduler.waiting))
    assert r2.status == RequestStatus.PREEMPTED and r2.num_computed_tokens == 0 and r2.num_preemptions == 1
    check_scheduler_invariants(scheduler)
    results = run_to_completion(core)
    assert {rid: r["finish_reason"] for rid, r in results.items()} == {
        "r0": "length", "r1": "length", "r2": "length", "late": "length"}
    assert scheduler.kv_cache_manager.num_free_blocks == 9


def test_preempted_request_produces_the_tokens_it_would_have_produced():
    prompts = {f"r{i}": list(range(i * 50, i * 50 + 30)) for i in range(6)}
    cramped = make_core(num_gpu_blocks=24, block_size=4)
    for request_id, prompt in prompts.items():
        cramped.add_request(make_request(request_id, prompt, max_tokens=40))
    results = run_to_completion(cramped)
    assert cramped.scheduler.num_preemptions_total > 0
    for request_id, prompt in prompts.items():
        assert results[request_id]["tokens"] == expected_tokens(cramped.executor, request_id, prompt, 40)


def test_priority_preemption_evicts_lowest_priority_even_if_already_scheduled():
    core = make_core(num_gpu_blocks=7, block_size=4, policy="priority", max_num_batched_tokens=64)
    scheduler = core.scheduler
    scheduler.add_request(make_request("low", range(8), max_tokens=20, priority=5, arrival_time=0.0))
    core.step()  # low alone: 2 blocks
    scheduler.add_request(make_request("high", range(100, 112), max_tokens=8, priority=0, arrival_time=1.0))
    core.step()  # low grows to 3 blocks, high admitted with 3: the pool (6 blocks) is full
    assert [r.request_id for r in scheduler.running] == ["low", "high"]
    step = core.step()
    # low was scheduled first in this step, but high needs a block: low is the victim, its tokens
    # go back to the budget, and high proceeds with low's blocks.
    assert step.scheduler_output.preempted_req_ids == {"low"}
    assert step.scheduler_output.num_scheduled_tokens == {"high": 1}
    check_scheduler_invariants(scheduler)
    results = run_to_completion(core)
    assert results["high"]["finish_reason"] == "length" and results["low"]["finish_reason"] == "length"
    assert scheduler.kv_cache_manager.num_free_blocks == 6


def test_priority_victim_among_equal_priority_and_arrival_is_the_first_in_running_order():
    # vLLM takes max(running, key=(priority, arrival_time)), which keeps the first of equal keys: when
    # a burst's requests tie on both, the one that needs a block and comes first preempts itself.
    core = make_core(num_gpu_blocks=5, block_size=4, policy="priority", max_num_batched_tokens=64)
    scheduler = core.scheduler
    scheduler.add_request(make_request("first", range(8), max_tokens=20, priority=1, arrival_time=0.0))
    scheduler.add_request(make_request("second", range(100, 108), max_tokens=20, priority=1, arrival_time=0.0))
    core.step()  # both admitted with 2 blocks each: the 4 usable blocks are taken
    step = core.step()
    assert step.scheduler_output.preempted_req_ids == {"first"}
    assert step.scheduler_output.num_scheduled_tokens == {}  # phase 1 stops at the self-preemption
    assert [request.request_id for request in scheduler.running] == ["second"]
    check_scheduler_invariants(scheduler)
    results = run_to_completion(core)
    assert results["first"]["finish_reason"] == "length" and results["second"]["finish_reason"] == "length"


@pytest.mark.parametrize("prompt_len, reason", [
    (0, "empty"), (5000, "max_model_len"), (900, "KV cache capacity")])
def test_unservable_prompts_are_ignored_and_never_wedge_the_queue(prompt_len, reason):
    core = make_core(num_gpu_blocks=51, block_size=16, max_model_len=4096)  # 800-token pool
    core.add_request(make_request("bad", range(prompt_len)))
    core.add_request(make_request("good", range(20), max_tokens=4))
    results = run_to_completion(core)
    assert results["bad"]["finish_reason"] == "ignored" and results["bad"]["tokens"] == []
    assert results["good"]["finish_reason"] == "length"
    assert core.scheduler.kv_cache_manager.num_free_blocks == 50


def test_ignored_output_carries_the_reason():
    core = make_core(max_model_len=100)
    core.add_request(make_request("bad", range(101)))
    output = core.step().outputs[0]
    assert output.finish_reason == "ignored" and "max_model_len 100" in output.status_message


def test_without_chunked_prefill_a_prompt_waits_until_it_fits_whole():
    core = make_core(max_num_batched_tokens=100, enable_chunked_prefill=False)
    core.add_request(make_request("a", range(60), max_tokens=3))
    core.add_request(make_request("b", range(200, 260), max_tokens=3))
    first = core.step().scheduler_output
    assert first.num_scheduled_tokens == {"a": 60}
    second = core.step().scheduler_output
    assert second.num_scheduled_tokens == {"a": 1, "b": 60}
    # A prompt longer than the budget can never run without chunking: it is ignored, not stuck.
    core.add_request(make_request("huge", range(500, 650)))
    results = run_to_completion(core)
    assert results["huge"]["finish_reason"] == "ignored"


def test_max_num_seqs_limits_the_running_batch():
    core = make_core(max_num_seqs=2)
    for index in range(5):
        core.add_request(make_request(f"r{index}", range(index * 10, index * 10 + 10), max_tokens=3))
    step = core.step()
    assert len(step.scheduler_output.num_scheduled_tokens) == 2
    assert len(core.scheduler.running) == 2 and len(core.scheduler.waiting) == 3
    run_to_completion(core)


def test_abort_at_any_stage_frees_everything():
    core = make_core(num_gpu_blocks=12, block_size=4)
    for index in range(4):
        core.add_request(make_request(f"r{index}", range(index * 100, index * 100 + 14), max_tokens=30))
    core.step()
    core.step()
    core.abort_requests(["r0", "r3", "unknown"])
    step = core.step()
    aborted = {o.request_id for o in step.outputs if o.finish_reason == "abort"}
    assert aborted == {"r0", "r3"}
    assert {"r0", "r3"} <= step.scheduler_output.finished_req_ids
    check_scheduler_invariants(core.scheduler)
    core.abort_requests("r1")
    run_to_completion(core)
    assert core.scheduler.kv_cache_manager.num_free_blocks == 11


def test_prefix_cache_hit_through_the_scheduler():
    core = make_core()
    shared = list(range(64))
    core.add_request(make_request("first", shared + [1000, 1001], max_tokens=2))
    run_to_completion(core)
    core.add_request(make_request("second", shared + [2000, 2001, 2002], max_tokens=2))
    step = core.step()
    new = step.scheduler_output.scheduled_new_reqs[0]
    assert new.num_computed_tokens == 64
    assert step.scheduler_output.num_scheduled_tokens["second"] == 3
    assert (step.scheduler_output.num_prefix_query_tokens, step.scheduler_output.num_prefix_hit_tokens) == (67, 64)
    assert step.outputs[0].num_cached_tokens == 64


def test_duplicate_request_id_is_rejected():
    core = make_core()
    core.add_request(make_request("a", range(4)))
    with pytest.raises(ValueError, match="already"):
        core.add_request(make_request("a", range(4)))


def test_common_prefix_blocks_and_blocks_to_zero():
    core = make_core(block_size=4)
    for index in range(3):
        core.add_request(make_request(f"r{index}", list(range(8)) + [100 + index] * 5, max_tokens=2))
    first = core.step().scheduler_output
    # Admitted in one step: later requests hit the blocks the first one cached in that same step.
    assert [new.num_computed_tokens for new in first.scheduled_new_reqs] == [0, 8, 8]
    assert first.num_common_prefix_blocks == 2
    assert len(first.new_block_ids_to_zero) == len(set(first.new_block_ids_to_zero)) == 4 + 2 + 2


def test_priority_victim_scheduled_in_the_same_step_leaves_no_uncomputed_blocks_cached():
    # The victim was scheduled (and its new full blocks registered in the prefix cache) earlier in the
    # step that preempts it: those blocks' KV is never computed, so they must not be findable.
    core = make_core(num_gpu_blocks=8, block_size=4, policy="priority", max_num_batched_tokens=64,
                     max_model_len=64, long_prefill_token_threshold=8)
    scheduler = core.scheduler
    core.add_request(make_request("low", range(200, 228), max_tokens=4, priority=5))
    core.step()
    core.add_request(make_request("high", range(100, 104), max_tokens=20, priority=0))
    preempted = False
    for _ in range(5):
        step = core.step()
        check_cached_blocks_were_computed(scheduler, core.executor)
        if "low" in step.scheduler_output.preempted_req_ids:
            preempted = True
            break
    assert preempted
    probe = make_request("probe", list(range(200, 228)) + [1, 2])
    probe.set_block_hasher(scheduler.block_hasher)
    _, num_hit_tokens = scheduler.kv_cache_manager.get_computed_blocks(probe)
    computed_before_preemption = 16  # two 8-token chunks ran before the preempting step
    assert num_hit_tokens <= computed_before_preemption
    results = run_to_completion(core)
    assert results["low"]["finish_reason"] == "length"
    check_cached_blocks_were_computed(scheduler, core.executor)
