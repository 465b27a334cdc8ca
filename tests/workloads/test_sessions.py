"""workload.sessions: drawing multi-turn conversations, and the errors a bad sessions section gets."""

from __future__ import annotations

import copy

import pytest

from workloads import WorkloadError, generate_requests, load_workload
from workloads.request_spec import count_requests

BASE = {
    "name": "sessions", "seed": 7,
    "engine": {"max_model_len": 4096},
    "workload": {"num_requests": 60, "arrival": {"type": "poisson", "rate": 3},
                 "prompt_len": {"type": "uniform", "min": 20, "max": 400},
                 "output_len": {"type": "uniform", "min": 5, "max": 300},
                 "shared_prefix": {"num_groups": 3, "prefix_len": 16, "fraction": 0.5},
                 "sessions": {"turns": {"type": "uniform", "min": 1, "max": 6},
                              "user_len": {"type": "uniform", "min": 10, "max": 200},
                              "think_time_s": {"type": "exponential", "mean": 4}}},
}


def workload(**changes):
    raw = copy.deepcopy(BASE)
    for path, value in changes.items():
        section = raw
        *parents, leaf = path.split("__")
        for key in parents:
            section = section[key]
        if value is None:
            section.pop(leaf, None)
        else:
            section[leaf] = value
    return load_workload(raw)


def generate(config):
    return generate_requests(config, vocab_size=1000, reserved_token_ids=[0, 1])


def test_each_session_has_its_later_turns_named_after_its_first():
    requests = generate(workload())
    assert len(requests) == 60 and count_requests(requests) > 150
    for spec in requests:
        assert spec.session_id == spec.request_id and spec.turn == 1
        assert [turn.request_id for turn in spec.next_turns] == [
            f"{spec.request_id}-turn{k}" for k in range(2, len(spec.next_turns) + 2)]
        for turn in spec.next_turns:
            assert 10 <= len(turn.user_token_ids) <= 200 and 5 <= turn.output_len <= 300
            assert turn.think_time_s >= 0
            assert min(turn.user_token_ids) >= 2  # reserved ids are never drawn
    assert max(len(spec.next_turns) for spec in requests) == 5
    assert generate(workload()) == requests  # the seed fixes everything


def test_sessions_leave_the_first_turns_as_they_were():
    with_sessions = generate(workload())
    without = generate(workload(workload__sessions=None))
    assert [(s.request_id, s.arrival_time, s.prompt_token_ids, s.output_len, s.prefix_group) for s in with_sessions] == [
        (s.request_id, s.arrival_time, s.prompt_token_ids, s.output_len, s.prefix_group) for s in without]
    assert all(spec.session_id is None and not spec.next_turns for spec in without)


def test_a_rate_sweep_leaves_every_session_unchanged():
    slow = generate(workload())
    fast = generate(workload(workload__arrival={"type": "poisson", "rate": 30}))
    assert [s.arrival_time for s in slow] != [s.arrival_time for s in fast]
    assert [(s.prompt_token_ids, s.next_turns) for s in slow] == [(s.prompt_token_ids, s.next_turns) for s in fast]


def test_the_next_turn_resends_the_conversation_with_the_users_new_tokens():
    spec = next(spec for spec in generate(workload()) if len(spec.next_turns) >= 2)
    generated = list(range(500, 500 + spec.output_len))
    conversation = spec.prompt_token_ids + type(spec.prompt_token_ids)("q", generated)
    turn = spec.next_turn(conversation, finish_time=12.5)
    first_follow_up = spec.next_turns[0]
    assert turn.request_id == first_follow_up.request_id and turn.turn == 2 and turn.session_id == spec.request_id
    assert turn.arrival_time == 12.5 + first_follow_up.think_time_s
    assert list(turn.prompt_token_ids) == list(conversation) + list(first_follow_up.user_token_ids)
    assert turn.output_len == first_follow_up.output_len and turn.next_turns == spec.next_turns[1:]
    assert (turn.priority, turn.prefix_group, turn.request_class) == (spec.priority, spec.prefix_group,
                                                                      spec.request_class)


def test_a_session_ends_before_a_turn_that_would_pass_the_length_cap():
    config = workload(engine__max_model_len=1200)
    requests = generate(config)
    uncapped = generate(workload())
    shortened = 0
    for spec, full in zip(requests, uncapped):
        length = spec.total_len
        for turn in spec.next_turns:
            length += len(turn.user_token_ids) + turn.output_len
            assert length <= 1200
        if len(spec.next_turns) < len(full.next_turns):
            shortened += 1
            # The turn dropped first is the one that would not fit.
            dropped = full.next_turns[len(spec.next_turns)]
            assert length + len(dropped.user_token_ids) + dropped.output_len > 1200
            assert spec.next_turns == full.next_turns[:len(spec.next_turns)]
    assert shortened > 10


@pytest.mark.parametrize("changes, field, message", [
    ({"workload__n": 2}, "workload.n", "must be 1 with sessions"),
    ({"workload__sessions__turns": {"type": "trace"}}, "workload.sessions.turns.type", "cannot be trace"),
    ({"workload__sessions__think_time_s": {"type": "uniform", "min": 5, "max": 1}}, "workload.sessions.think_time_s",
     "must be >= min"),
    ({"workload__sessions__think_time_s": {"type": "exponential", "mean": -1}}, "workload.sessions.think_time_s",
     "greater than 0"),
    ({"workload__sessions__user_len": None}, "workload.sessions.user_len", "required"),
    ({"cluster": {"num_replicas": 2, "prefill_replicas": 1}}, "cluster.prefill_replicas", "must be 0 with workload sessions"),
])
def test_a_bad_sessions_section_is_named(changes, field, message):
    with pytest.raises(WorkloadError) as error:
        workload(**changes)
    text = str(error.value)
    assert field in text and message in text
