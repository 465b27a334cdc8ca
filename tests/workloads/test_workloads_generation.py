"""The request stream: reproducible, independent per quantity, and statistically what was asked for."""

from __future__ import annotations

import numpy as np
import pytest

from workloads import RequestSpec, generate_requests, load_workload
from workloads.generator import fit_total_length

VOCAB_SIZE = 1000


def lengths_and_tokens(requests: list[RequestSpec]) -> list[tuple]:
    return [(r.prompt_token_ids, r.output_len, r.priority, r.prefix_group) for r in requests]


def test_request_fields_ids_and_order(raw_workload):
    requests = generate_requests(load_workload(raw_workload), VOCAB_SIZE)
    assert len(requests) == 200
    assert [r.request_id for r in requests[:2]] == ["req-000000", "req-000001"]
    assert requests[0].arrival_time == 0.0
    assert all(a.arrival_time <= b.arrival_time for a, b in zip(requests, requests[1:]))
    assert all(8 <= r.num_prompt_tokens <= 64 and r.output_len == 16 for r in requests)
    assert all(isinstance(token, int) for token in requests[0].prompt_token_ids)
    with pytest.raises(AttributeError):
        requests[0].output_len = 3  # frozen


def test_same_seed_same_stream_other_seed_other_stream(raw_workload, set_path):
    config = load_workload(raw_workload)
    assert generate_requests(config, VOCAB_SIZE) == generate_requests(config, VOCAB_SIZE)
    other = generate_requests(config.with_overrides(["seed=8"]), VOCAB_SIZE)
    base = generate_requests(config, VOCAB_SIZE)
    assert [r.prompt_token_ids for r in other] != [r.prompt_token_ids for r in base]
    assert [r.arrival_time for r in other] != [r.arrival_time for r in base]


def test_rate_sweep_keeps_lengths_and_tokens(raw_workload):
    raw_workload["workload"]["shared_prefix"] = {"num_groups": 3, "prefix_len": 4, "fraction": 0.5}
    raw_workload["workload"]["priority"] = {"levels": [0, 1]}
    raw_workload["sweep"] = {"workload.arrival.rate": [1, 4, 16]}
    points = load_workload(raw_workload).sweep_points()
    streams = [generate_requests(point, VOCAB_SIZE) for _, point in points]
    assert lengths_and_tokens(streams[0]) == lengths_and_tokens(streams[1]) == lengths_and_tokens(streams[2])
    # The arrival pattern is the same gaps, stretched: times scale exactly with 1 / rate.
    times = [np.array([r.arrival_time for r in stream]) for stream in streams]
    np.testing.assert_allclose(times[0], times[1] * 4)


def test_duration_mode_rate_sweep_keeps_each_request(raw_workload, delete_path):
    delete_path(raw_workload, "workload.num_requests")
    raw_workload["workload"]["duration_s"] = 20.0
    slow = generate_requests(load_workload(raw_workload, ["workload.arrival.rate=2"]), VOCAB_SIZE)
    fast = generate_requests(load_workload(raw_workload, ["workload.arrival.rate=8"]), VOCAB_SIZE)
    assert len(fast) > len(slow)
    assert lengths_and_tokens(fast[: len(slow)]) == lengths_and_tokens(slow)
    assert all(r.arrival_time < 20.0 for r in fast)


def test_changing_outputs_keeps_prompts(raw_workload):
    base = generate_requests(load_workload(raw_workload), VOCAB_SIZE)
    changed = generate_requests(
        load_workload(raw_workload, ["workload.output_len={type: uniform, min: 1, max: 9}"]), VOCAB_SIZE
    )
    assert [r.prompt_token_ids for r in changed] == [r.prompt_token_ids for r in base]


def test_shared_prefix_groups_share_leading_tokens(raw_workload):
    raw_workload["workload"].update(
        num_requests=4000,
        prompt_len={"type": "uniform", "min": 20, "max": 40},
        shared_prefix={"num_groups": 4, "prefix_len": 24, "fraction": 0.3},
    )
    requests = generate_requests(load_workload(raw_workload), VOCAB_SIZE)
    members = [r for r in requests if r.prefix_group is not None]
    assert abs(len(members) / len(requests) - 0.3) < 0.03
    assert {r.prefix_group for r in members} == {0, 1, 2, 3}
    prefixes = {}
    for request in members:
        assert request.num_prompt_tokens >= 25  # raised to prefix_len + 1
        prefix = tuple(request.prompt_token_ids[:24])
        assert prefixes.setdefault(request.prefix_group, prefix) == prefix
    assert len(set(prefixes.values())) == 4
    # Outside the prefix, prompts are fresh: no two members of a group continue identically.
    group_zero = [tuple(r.prompt_token_ids[24:]) for r in members if r.prefix_group == 0 and r.num_prompt_tokens >= 30]
    assert len(set(group_zero)) == len(group_zero)
    assert all(r.num_prompt_tokens <= 40 for r in requests if r.prefix_group is None)


def test_poisson_arrivals_have_the_configured_rate(raw_workload):
    raw_workload["workload"].update(
        num_requests=20000, arrival={"type": "poisson", "rate": 10.0}, prompt_len={"type": "constant", "value": 1}
    )
    times = np.array([r.arrival_time for r in generate_requests(load_workload(raw_workload), VOCAB_SIZE)])
    gaps = np.diff(times)
    assert abs(1 / gaps.mean() - 10.0) < 0.3
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.05  # exponential gaps: cv = 1


def test_gamma_arrivals_have_the_configured_cv(raw_workload):
    raw_workload["workload"].update(
        num_requests=20000,
        arrival={"type": "gamma", "rate": 4.0, "cv": 2.5},
        prompt_len={"type": "constant", "value": 1},
    )
    gaps = np.diff([r.arrival_time for r in generate_requests(load_workload(raw_workload), VOCAB_SIZE)])
    assert abs(1 / gaps.mean() - 4.0) < 0.25
    assert abs(gaps.std() / gaps.mean() - 2.5) < 0.2


def test_constant_and_burst_arrivals(raw_workload):
    raw_workload["workload"]["arrival"] = {"type": "constant", "rate": 4.0}
    times = [r.arrival_time for r in generate_requests(load_workload(raw_workload), VOCAB_SIZE)]
    np.testing.assert_allclose(np.diff(times), 0.25)
    raw_workload["workload"]["arrival"] = {"type": "bursts", "burst_size": 50, "burst_interval_s": 10.0}
    times = np.array([r.arrival_time for r in generate_requests(load_workload(raw_workload), VOCAB_SIZE)])
    assert sorted(set(times.tolist())) == [0.0, 10.0, 20.0, 30.0]
    assert (times == 10.0).sum() == 50


def test_tokens_avoid_reserved_ids_and_stay_in_vocabulary(raw_workload):
    reserved = list(range(0, VOCAB_SIZE, 2))  # every even id
    requests = generate_requests(load_workload(raw_workload), VOCAB_SIZE, reserved_token_ids=reserved)
    tokens = np.concatenate([r.prompt_token_ids for r in requests])
    assert tokens.min() >= 1 and tokens.max() < VOCAB_SIZE and (tokens % 2 == 1).all()
    assert len(np.unique(tokens)) > 400  # uniform over the 500 allowed ids


def test_priorities_follow_the_weights(raw_workload):
    raw_workload["workload"].update(num_requests=5000, priority={"levels": [0, 5, 9], "weights": [1, 1, 2]})
    priorities = np.array([r.priority for r in generate_requests(load_workload(raw_workload), VOCAB_SIZE)])
    assert set(priorities.tolist()) == {0, 5, 9}
    assert abs((priorities == 9).mean() - 0.5) < 0.03


def test_length_distributions_hit_their_means(raw_workload):
    raw_workload["workload"].update(
        num_requests=20000,
        prompt_len={"type": "lognormal", "mean": 300, "sigma": 0.6},
        output_len={"type": "normal", "mean": 100, "std": 10, "min": 90},
    )
    requests = generate_requests(load_workload(raw_workload), VOCAB_SIZE)
    prompts = np.array([r.num_prompt_tokens for r in requests])
    outputs = np.array([r.output_len for r in requests])
    assert abs(prompts.mean() - 300) < 10
    assert outputs.min() == 90 and abs(np.median(outputs) - 100) <= 1


def test_total_length_cap_trims_long_requests(raw_workload):
    raw_workload["workload"].update(
        prompt_len={"type": "uniform", "min": 100, "max": 900},
        output_len={"type": "uniform", "min": 1, "max": 400},
        max_total_len=512,
    )
    requests = generate_requests(load_workload(raw_workload), VOCAB_SIZE)
    assert max(r.total_len for r in requests) == 512
    assert all(r.output_len >= 1 and r.num_prompt_tokens >= 1 for r in requests)


def test_engine_max_model_len_caps_when_no_workload_cap(raw_workload):
    raw_workload["engine"]["max_model_len"] = 256
    raw_workload["workload"]["prompt_len"] = {"type": "constant", "value": 1000}
    requests = generate_requests(load_workload(raw_workload), VOCAB_SIZE)
    assert all(r.total_len == 256 for r in requests)


def test_fit_total_length_cuts_in_proportion_and_keeps_minimums():
    prompts, outputs = fit_total_length(
        np.array([300, 10, 1, 50]), np.array([100, 990, 1000, 10]), 200, np.array([1, 6, 1, 1])
    )
    assert (prompts + outputs).tolist() == [200, 200, 200, 60]
    assert prompts.tolist()[0] == 150 and outputs.tolist()[0] == 50  # 3:1 kept
    assert prompts.tolist()[1] == 6  # never below its minimum
    assert outputs.min() >= 1


def test_zero_requests_in_a_duration_is_an_error(raw_workload, delete_path):
    from workloads import WorkloadError

    delete_path(raw_workload, "workload.num_requests")
    raw_workload["workload"]["duration_s"] = 1e-9
    raw_workload["workload"]["arrival"] = {"type": "constant", "rate": 1.0}
    # The first request arrives at t = 0, inside any positive duration.
    assert len(generate_requests(load_workload(raw_workload), VOCAB_SIZE)) == 1
    with pytest.raises(WorkloadError, match="vocab_size"):
        generate_requests(load_workload(raw_workload), 0)
