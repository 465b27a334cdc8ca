"""The core's side of speculative decoding, step by step with a hand-written executor output
(engine/core/spec_decode.py; the state machine covers it at random: test_scheduler_state_machine.py)."""

from __future__ import annotations

import pytest

from engine.core.outputs import ModelRunnerOutput

from tests.core.helpers import make_core, make_request


def _decode_with_drafts(core, drafts):
    """Run the prompt's step, leave the request holding ``drafts``, and schedule the step verifying them."""
    scheduler = core.scheduler
    output = scheduler.schedule()
    scheduler.update_from_output(output, ModelRunnerOutput(["r"], {"r": 0}, [[11]], spec_token_ids={"r": drafts}))
    return scheduler.schedule()


def test_a_step_verifies_the_drafts_and_rolls_back_the_rejected_ones():
    core = make_core(num_speculative_tokens=3)
    scheduler = core.scheduler
    scheduler.add_request(make_request("r", range(100, 120), max_tokens=10))
    output = _decode_with_drafts(core, [12, 13, 14])
    assert output.num_scheduled_tokens == {"r": 4} and output.scheduled_spec_decode_tokens == {"r": [12, 13, 14]}
    request = scheduler.requests["r"]
    assert request.num_computed_tokens == 24  # the 20 prompt tokens, the sampled one and three drafts
    # One draft kept, then another token: two positions taken back.
    outputs = scheduler.update_from_output(output, ModelRunnerOutput(["r"], {"r": 0}, [[12, 40]]))
    assert outputs[0].new_token_ids == [12, 40]
    assert (request.num_tokens, request.num_computed_tokens) == (23, 22)
    assert scheduler.spec_decoding_stats.to_dict()["num_accepted_tokens_per_position"] == [1, 0, 0]


def test_a_stop_token_among_the_kept_drafts_cuts_the_tokens_and_their_logprobs():
    core = make_core(num_speculative_tokens=3)
    scheduler = core.scheduler
    scheduler.add_request(make_request("r", range(100, 120), max_tokens=10, stop_token_ids=[13]))
    output = _decode_with_drafts(core, [12, 13, 14])
    logprobs = {"r": ["lp12", "lp13", "lp14", "lp50"]}  # one entry per token, opaque to the core
    outputs = scheduler.update_from_output(output, ModelRunnerOutput(["r"], {"r": 0}, [[12, 13, 14, 50]],
                                                                     logprobs=logprobs))
    assert outputs[0].new_token_ids == [12, 13] and outputs[0].finish_reason == "stop"
    assert outputs[0].logprobs == ["lp12", "lp13"]
    assert logprobs["r"] == ["lp12", "lp13", "lp14", "lp50"]  # the executor's payload is not changed
    manager = scheduler.kv_cache_manager
    assert not scheduler.requests and manager.num_free_blocks == manager.num_usable_blocks


def test_drafts_are_trimmed_to_what_the_request_may_still_produce():
    core = make_core(num_speculative_tokens=5)
    scheduler = core.scheduler
    scheduler.add_request(make_request("r", range(100, 120), max_tokens=3))
    output = _decode_with_drafts(core, [1, 2, 3, 4, 5])
    # One token produced, two more allowed: one is sampled anyway, so one draft.
    assert output.scheduled_spec_decode_tokens == {"r": [1]}


def test_an_executor_returning_more_tokens_than_the_drafts_allow_is_named():
    core = make_core(num_speculative_tokens=2)
    scheduler = core.scheduler
    scheduler.add_request(make_request("r", range(100, 120), max_tokens=10))
    output = _decode_with_drafts(core, [1, 2])
    with pytest.raises(RuntimeError, match="returned 4 tokens for a step with 2 draft tokens"):
        scheduler.update_from_output(output, ModelRunnerOutput(["r"], {"r": 0}, [[1, 2, 3, 4]]))


def test_a_position_is_judged_only_when_a_draft_sits_there_and_every_one_before_it_was_kept():
    """Conditional acceptance divides by the judged drafts: a one-token proposal (an n-gram lookup's) leaves the
    later positions unjudged, not rejected; a rejection leaves the positions after it unjudged."""
    from engine.core.spec_decode import SpecDecodingStats

    stats = SpecDecodingStats(3)
    stats.record(1, 1)  # one draft, kept
    stats.record(3, 1)  # three, the second rejected
    stats.record(2, 2)  # two, both kept
    stats.record(3, 0)  # three, the first rejected
    counts = stats.to_dict()
    assert counts["num_accepted_tokens_per_position"] == [3, 1, 0]
    assert counts["num_judged_tokens_per_position"] == [4, 2, 0]
    from analysis.spec_decode_stats import merge_spec_decoding

    merged = merge_spec_decoding([counts, counts])
    assert merged["conditional_acceptance_per_position"] == [0.75, 0.5, 0.0]
    # Counts from before the judged ones were recorded fall back to accepted at the position before.
    old = {key: value for key, value in counts.items() if key != "num_judged_tokens_per_position"}
    assert merge_spec_decoding([old])["conditional_acceptance_per_position"] == [0.75, 1 / 3, 0.0]
