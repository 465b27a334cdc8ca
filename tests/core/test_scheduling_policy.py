"""Scheduling policies beyond vLLM's fcfs and priority (engine/core/scheduling_policy.py): the named ranked
policies and a user's ``module:function``, through the same scheduler; admission order and preemption victims."""

from __future__ import annotations

import pytest

from engine.core import SchedulerConfig
from engine.core.scheduling_policy import NAMED_POLICIES, reads_priority
from tests.core.helpers import check_scheduler_invariants, make_core, make_request, run_to_completion
from workloads.sections import SCHEDULING_POLICIES


def admission_order(core) -> list[str]:
    order = []
    while core.has_work():
        step = core.step()
        if step.scheduler_output:
            order += [new.req_id for new in step.scheduler_output.scheduled_new_reqs]
    return order


def test_shortest_prompt_first_admits_by_prompt_length_ties_by_arrival():
    core = make_core(policy="shortest_prompt_first", max_num_seqs=1)
    for request_id, prompt_len, arrival in [("long", 30, 0.0), ("short-late", 10, 2.0), ("mid", 20, 1.0),
                                            ("short-early", 10, 1.5)]:
        core.add_request(make_request(request_id, range(prompt_len), max_tokens=1, arrival_time=arrival))
    assert admission_order(core) == ["short-early", "short-late", "mid", "long"]


def test_shortest_output_first_admits_by_output_tokens_left():
    core = make_core(policy="shortest_output_first", max_num_seqs=1)
    for request_id, max_tokens in [("five", 5), ("one", 1), ("three", 3), ("unbounded", None)]:
        core.add_request(make_request(request_id, range(8), max_tokens=max_tokens, ignore_eos=True))
    order = []
    while core.has_work() and len(order) < 4:
        step = core.step()
        if step.scheduler_output:
            order += [new.req_id for new in step.scheduler_output.scheduled_new_reqs]
        if order == ["one", "three", "five"]:  # the unbounded one would run to max_model_len: enough
            break
    assert order == ["one", "three", "five"]
    assert [request.request_id for request in core.scheduler.waiting] == ["unbounded"]


@pytest.mark.parametrize("policy, expected", [
    ("tests.core.rank_functions:longest_prompt_first", ["r-2", "r-1", "r-3"]),
    ("tests.core.rank_functions:by_request_id_suffix", ["r-1", "r-2", "r-3"]),
])
def test_a_users_rank_function_orders_the_queue(policy, expected):
    core = make_core(policy=policy, max_num_seqs=1)
    for request_id, prompt_len in [("r-3", 5), ("r-1", 20), ("r-2", 40)]:
        core.add_request(make_request(request_id, range(prompt_len), max_tokens=1))
    assert admission_order(core) == expected


def test_a_short_pool_preempts_the_running_request_of_largest_rank():
    # As the priority test's: 6 usable blocks of 4 tokens. "long" (12-token prompt) ranks after "short" (8)
    # under shortest_prompt_first, so when "short" needs a block, "long" is the victim, though it arrived first.
    core = make_core(num_gpu_blocks=7, block_size=4, policy="shortest_prompt_first", max_num_batched_tokens=64)
    scheduler = core.scheduler
    scheduler.add_request(make_request("long", range(100, 112), max_tokens=20, arrival_time=0.0))
    core.step()  # long alone: 3 blocks
    scheduler.add_request(make_request("short", range(8), max_tokens=20, arrival_time=1.0))
    core.step()  # long grows to 4 blocks... short admitted with 2: the pool is full
    victims = set()
    for _ in range(8):
        step = core.step()
        victims |= step.scheduler_output.preempted_req_ids
        check_scheduler_invariants(scheduler)
        if victims:
            break
    assert victims == {"long"}
    results = run_to_completion(core)
    assert results["short"]["finish_reason"] == "length" and results["long"]["finish_reason"] == "length"
    assert scheduler.kv_cache_manager.num_free_blocks == 6


@pytest.mark.parametrize("policy, says", [
    ("lifo", "one of 'fcfs', 'priority'"),
    ("no_such_module_here:rank", "whose module imports (No module named 'no_such_module_here')"),
    ("tests.core.rank_functions:missing", "has no callable 'missing'"),
    ("tests.core.rank_functions:NOT_CALLABLE", "has no callable 'NOT_CALLABLE'"),
    (":rank", "'module:function'"),
])
def test_a_bad_policy_is_refused_naming_the_field_and_value(policy, says):
    with pytest.raises(ValueError) as error:
        SchedulerConfig(policy=policy)
    assert str(error.value).startswith("scheduler.policy must be") and says in str(error.value)
    assert repr(policy) in str(error.value)


def test_the_workload_schema_names_the_engines_policies():
    assert SCHEDULING_POLICIES == NAMED_POLICIES


def test_only_policies_that_may_read_priority_accept_one():
    assert [reads_priority(policy) for policy in NAMED_POLICIES] == [False, True, False, False]
    assert reads_priority("tests.core.rank_functions:longest_prompt_first")
