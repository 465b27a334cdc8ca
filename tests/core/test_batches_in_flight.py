"""Batches in flight (engine/core/batches_in_flight.py): examples the state machine found hard to reach."""

from __future__ import annotations

from tests.core.helpers import check_scheduler_invariants, make_core, make_request


def test_a_priority_victim_passed_over_for_its_token_in_flight_does_not_make_the_next_request_skip_a_step():
    # Three usable blocks of 4 slots. X (low priority) is in flight when Y and Z arrive; when Y needs a block,
    # X (passed over: its token is in flight) is the victim, and Z behind it must still be scheduled.
    core = make_core(num_gpu_blocks=4, block_size=4, policy="priority", max_num_batched_tokens=64)
    scheduler = core.scheduler
    core.add_request(make_request("X", [1, 2], max_tokens=30, priority=5))
    b0 = core.start_step()
    core.add_request(make_request("Y", [3, 4, 5, 6], max_tokens=30, priority=0))
    core.add_request(make_request("Z", [7, 8], max_tokens=30, priority=0))
    b1 = core.start_step()
    core.finish_step(b0)
    b2 = core.start_step()
    core.finish_step(b1)
    b3 = core.start_step()
    assert b3.scheduler_output.preempted_req_ids == {"X"}
    assert set(b3.scheduler_output.num_scheduled_tokens) == {"Y", "Z"}
    for started in (b2, b3):
        core.finish_step(started)
    check_scheduler_invariants(scheduler)


def test_a_new_request_that_takes_an_aborted_ids_place_gets_none_of_its_tokens_in_flight():
    core = make_core()
    core.add_request(make_request("R", [1, 2, 3], max_tokens=4))
    in_flight = core.start_step()
    core.abort_requests(["R"])
    core.add_request(make_request("R", [9, 9, 9, 9, 9], max_tokens=4))
    outputs = core.finish_step(in_flight)
    assert all(output.request_id != "R" or output.finish_reason == "abort" for output in outputs)
    request = core.scheduler.requests["R"]
    assert request.output_token_ids == [] and request.num_tokens == 5
    # The new request runs as if the old one had never been.
    finished = []
    while core.has_work():
        finished += [output for output in core.step().outputs if output.finish_reason]
    assert [(output.request_id, output.finish_reason) for output in finished] == [("R", "length")]
