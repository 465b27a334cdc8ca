"""Phases: a stream whose mix changes over time, each stretch generated on its own after the previous."""

from __future__ import annotations

import pytest

from workloads import WorkloadError, generate_requests, load_workload

VOCAB_SIZE = 1000
LONG_PHASE = {"num_requests": 30, "gap_s": 5.0, "arrival": {"type": "poisson", "rate": 1.0},
              "prompt_len": {"type": "uniform", "min": 300, "max": 400},
              "output_len": {"type": "constant", "value": 50},
              "shared_prefix": {"num_groups": 1, "prefix_len": 128}}


def test_phases_follow_one_another(raw_workload):
    raw_workload["workload"]["phases"] = [LONG_PHASE]
    requests = generate_requests(load_workload(raw_workload), VOCAB_SIZE)
    first, later = requests[:200], requests[200:]
    assert len(requests) == 230 and len(later) == 30
    assert [r.request_id for r in requests] == [f"req-{index:06d}" for index in range(230)]
    assert all(a.arrival_time <= b.arrival_time for a, b in zip(requests, requests[1:]))
    # The later stretch starts gap_s after the first one's last arrival, with lengths of its own.
    assert later[0].arrival_time == pytest.approx(first[-1].arrival_time + 5.0)
    assert all(8 <= r.num_prompt_tokens <= 64 and r.output_len == 16 and r.prefix_group is None for r in first)
    assert all(300 <= r.num_prompt_tokens <= 400 and r.output_len == 50 and r.prefix_group == 0 for r in later)
    assert len({tuple(r.prompt_token_ids[:128]) for r in later}) == 1


def test_adding_a_phase_leaves_the_earlier_stream_unchanged(raw_workload):
    alone = generate_requests(load_workload(raw_workload), VOCAB_SIZE)
    raw_workload["workload"]["phases"] = [LONG_PHASE, dict(LONG_PHASE, gap_s=0.0)]
    with_phases = generate_requests(load_workload(raw_workload), VOCAB_SIZE)
    assert with_phases[:200] == alone
    # Two phases with the same settings still draw different requests (each has its own seed).
    second, third = with_phases[200:230], with_phases[230:]
    assert [r.prompt_token_ids for r in second] != [r.prompt_token_ids for r in third]
    assert generate_requests(load_workload(raw_workload), VOCAB_SIZE) == with_phases


def test_a_phase_is_checked_against_the_engine_and_named_in_the_error(raw_workload):
    raw_workload["engine"]["max_model_len"] = 256
    raw_workload["workload"]["phases"] = [dict(LONG_PHASE, prompt_len={"type": "uniform", "min": 10, "max": 100},
                                               shared_prefix={"num_groups": 1, "prefix_len": 300})]
    with pytest.raises(WorkloadError, match=r"workload\.phases\[0\]\.shared_prefix\.prefix_len"):
        load_workload(raw_workload)


def test_a_misspelled_key_in_a_phase_is_an_error(raw_workload):
    raw_workload["workload"]["phases"] = [dict(LONG_PHASE, gap=1.0)]
    with pytest.raises(WorkloadError, match=r"workload\.phases\[0\]\.gap: unknown key; did you mean .gap_s."):
        load_workload(raw_workload)
    raw_workload["workload"]["phases"] = []
    with pytest.raises(WorkloadError, match="phases"):
        load_workload(raw_workload)


def test_overrides_and_sweeps_reach_into_a_phase(raw_workload):
    raw_workload["workload"]["phases"] = [LONG_PHASE]
    config = load_workload(raw_workload, overrides=["workload.phases.0.arrival.rate=4.0"])
    assert config.workload.phases[0].arrival.rate == 4.0
    with pytest.raises(WorkloadError, match=r"workload\.phases\.3: must be an index of the 1 entries"):
        load_workload(raw_workload, overrides=["workload.phases.3.gap_s=1"])
    with pytest.raises(WorkloadError, match=r"workload\.phases\.0\.gap: no such setting; did you mean 'gap_s'"):
        load_workload(raw_workload, overrides=["workload.phases.0.gap=1"])
    raw_workload["sweep"] = {"workload.phases.0.gap_s": [0.0, 30.0]}
    points = load_workload(raw_workload).sweep_points()
    assert [point.workload.phases[0].gap_s for _, point in points] == [0.0, 30.0]
    first, later = (generate_requests(point, VOCAB_SIZE) for _, point in points)
    assert later[200].arrival_time == pytest.approx(first[200].arrival_time + 30.0)
