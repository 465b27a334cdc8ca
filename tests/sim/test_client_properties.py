"""Properties of the client side of a simulation (multi-turn sessions, a concurrency limit) over random workloads:
every request is served and its blocks freed, no more than the limit are ever in flight, each later turn is sent
no earlier than its think time after the turn before finished (exactly then when a slot is free), its prompt is
the whole conversation, and the fast-forward changes nothing; with and without async scheduling (a loop of two
batches in flight, sim/pipeline_stages.py), and with sliding windows (later turns hit blocks the window of an
earlier one has handed back)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from engine.core import EngineCore, Scheduler
from sim.engine_setup import build_setup
from sim.sim_executor import SimulatedExecutor
from sim.simulator import Simulation
from workloads import load_workload
from workloads.request_spec import count_requests

from tests.sim.test_fast_forward_equivalence import windowed_mistral


def simulate(workload, fast_forward: bool):
    setup = build_setup(workload)
    engine = EngineCore(Scheduler(setup.scheduler_config, setup.cache_config), SimulatedExecutor(setup.cost_model))
    recorder = Simulation(engine, setup.requests, fast_forward=fast_forward,
                          max_concurrency=workload.workload.max_concurrency).run()
    manager = engine.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks  # every request's blocks came back
    return setup.requests, recorder.request_columns()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**20), limit=st.one_of(st.none(), st.integers(1, 6)), max_turns=st.integers(1, 4),
       think=st.sampled_from([0.0, 0.002, 0.5]), blocks=st.integers(24, 200), rate=st.sampled_from([20.0, 400.0]),
       max_num_seqs=st.integers(1, 8), async_scheduling=st.booleans(),
       window=st.one_of(st.none(), st.sampled_from([8, 20, 64])))
# A turn sent by a finish inside a fast-forwarded stretch and a new request both arrive during its last step, the
# turn first: the turn must reach the engine first (it used to be sent only once the stretch had ended).
@example(seed=18743, limit=None, max_turns=3, think=0.002, blocks=28, rate=20.0, max_num_seqs=4, async_scheduling=False,
         window=None)
def test_sessions_and_limits_keep_their_promises(seed, limit, max_turns, think, blocks, rate, max_num_seqs,
                                                 async_scheduling, window, tmp_path_factory):
    model = "llama-3-8b" if window is None else windowed_mistral(tmp_path_factory.getbasetemp(), window)
    workload = load_workload({
        "name": "client-properties", "seed": seed, "model": model, "hardware": "h100-sxm",
        "engine": {"block_size": 16, "num_gpu_blocks": blocks, "max_num_seqs": max_num_seqs,
                   "max_num_batched_tokens": 128, "max_model_len": 384, "enable_prefix_caching": True,
                   "async_scheduling": async_scheduling},
        "workload": {"num_requests": 8, "arrival": {"type": "poisson", "rate": rate}, "max_concurrency": limit,
                     "prompt_len": {"type": "uniform", "min": 8, "max": 120},
                     "output_len": {"type": "uniform", "min": 1, "max": 40},
                     "sessions": {"turns": {"type": "uniform", "min": 1, "max": max_turns},
                                  "user_len": {"type": "uniform", "min": 1, "max": 30},
                                  "think_time_s": {"type": "constant", "value": think}}}})
    specs, columns = simulate(workload, fast_forward=True)
    _, slow_columns = simulate(workload, fast_forward=False)
    assert {key: value for key, value in columns.items()} == slow_columns

    rows = {request_id: index for index, request_id in enumerate(columns["request_id"])}
    assert len(rows) == count_requests(specs)
    assert all(reason in ("length", "ignored") for reason in columns["finish_reason"])
    arrivals, finishes = columns["arrival_time"], columns["finish_time"]
    if limit is not None:
        events = sorted([(time, 1) for time in arrivals] + [(time, -1) for time in finishes])
        in_flight = peak = 0
        for _, change in events:
            in_flight += change
            peak = max(peak, in_flight)
        assert peak <= limit
    for first in specs:
        previous, length = first.request_id, first.total_len
        for turn in first.next_turns:
            row, before = rows[turn.request_id], rows[previous]
            assert arrivals[row] >= finishes[before] + think
            if limit is None:
                assert arrivals[row] == finishes[before] + think
            if columns["finish_reason"][before] == "length":
                assert columns["num_prompt_tokens"][row] == length + len(turn.user_token_ids)
            length = columns["num_prompt_tokens"][row] + turn.output_len
            previous = turn.request_id


@pytest.mark.parametrize("limit", [None, 3])
def test_a_cluster_whose_finishes_send_requests_steps_as_without_the_fast_forward(limit):
    """A turn or a held request sent at one replica's finish may be routed to another in the middle of a stretch
    it fast-forwarded; the simulation takes such a cluster's steps one by one, so its traces are those of
    --no-fast-forward (with the fast-forward on, every one of 48 seeded cases differed)."""
    from sim.run_pipeline import simulate as simulate_cluster

    workload = load_workload({
        "name": "cluster-sessions", "seed": 10, "engine": {"num_gpu_blocks": 4000, "max_num_seqs": 32},
        "cluster": {"num_replicas": 3, "router": "round_robin"},
        "workload": {"num_requests": 30, "arrival": {"type": "poisson", "rate": 0.5}, "max_concurrency": limit,
                     "prompt_len": {"type": "uniform", "min": 50, "max": 400},
                     "output_len": {"type": "uniform", "min": 50, "max": 400},
                     "sessions": {"turns": {"type": "uniform", "min": 1, "max": 4},
                                  "user_len": {"type": "uniform", "min": 5, "max": 50},
                                  "think_time_s": {"type": "exponential", "mean": 0.3}}}})
    setup = build_setup(workload)
    on = simulate_cluster(setup, progress=False, description="on", fast_forward=True).request_columns()
    off = simulate_cluster(setup, progress=False, description="off", fast_forward=False).request_columns()
    assert on == off and len(on["request_id"]) == count_requests(setup.requests)
