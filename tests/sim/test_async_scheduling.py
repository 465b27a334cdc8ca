"""vLLM's async scheduling in the simulator: the engine schedules the next step while the GPU runs this one,
through the shared scheduler's placeholders, so its own overhead overlaps the GPU's time."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.engine_setup import SetupError, build_setup
from sim.profile_match import SHIPPED_PROFILES_DIR
from sim.simulator import Simulation
from tests.sim.test_cluster import chat, tables
from tests.sim.test_pipeline_parallel import (_engine, _in_flight_at_each_start, serve_whole_outputs,
                                              simulates_identically_twice)
from workloads import example_path, load_workload


def one_request(async_scheduling: bool):
    workload = chat("workload.num_requests=1", "workload.output_len={type: constant, value: 20}",
                    f"engine.async_scheduling={str(async_scheduling).lower()}")
    setup = build_setup(workload)
    requests, steps = tables(Simulation(_engine(setup), setup.requests).run())
    return setup, requests, steps


def test_alone_a_request_decodes_one_gpu_step_apart_instead_of_overhead_plus_gpu_step():
    setup, requests, steps = one_request(True)
    _, sync_requests, sync_steps = one_request(False)
    gaps = np.diff(np.asarray(requests["token_times"].iloc[0]))
    sync_gaps = np.diff(np.asarray(sync_requests["token_times"].iloc[0]))
    overhead = setup.hardware.step_overhead_s
    assert overhead > 0 and len(gaps) == len(sync_gaps) == 19
    # Synchronous: each token waits for the engine's overhead, then the GPU. Async: the engine prepared the
    # next step while the GPU ran this one (the GPU's step is longer than the overhead), so the GPU runs step
    # after step and every gap is one overhead shorter, the first one too.
    np.testing.assert_allclose(sync_gaps - gaps, overhead, rtol=1e-6)
    assert (gaps > overhead).all()
    # The same steps, none past the request's length; two in flight most of the time.
    assert len(steps) == len(sync_steps) == 20
    assert steps["num_scheduled_tokens"].tolist() == sync_steps["num_scheduled_tokens"].tolist()
    assert max(_in_flight_at_each_start(steps)) == 2
    assert requests["first_token_time"].iloc[0] == pytest.approx(sync_requests["first_token_time"].iloc[0])


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rate=st.sampled_from([5, 60]), num_gpu_blocks=st.sampled_from([120, 3000]),
       policy=st.sampled_from(["fcfs", "priority"]), chunked=st.booleans(), caching=st.booleans(),
       seed=st.integers(0, 3))
def test_every_request_is_served_with_its_whole_output_under_any_pressure(rate, num_gpu_blocks, policy, chunked,
                                                                           caching, seed):
    workload = chat("workload.num_requests=40", "engine.async_scheduling=true", f"workload.arrival.rate={rate}",
                    f"engine.num_gpu_blocks={num_gpu_blocks}", "engine.max_model_len=2048",
                    f"engine.scheduling_policy={policy}", f"engine.enable_chunked_prefill={str(chunked).lower()}",
                    f"engine.enable_prefix_caching={str(caching).lower()}", "engine.max_num_batched_tokens=2048",
                    f"seed={seed}")
    serve_whole_outputs(workload, max_in_flight=2)


def test_an_async_run_is_deterministic():
    simulates_identically_twice(chat("workload.arrival.rate=40", "engine.async_scheduling=true",
                                     "workload.num_requests=120", "engine.num_gpu_blocks=200",
                                     "engine.max_model_len=2048"))


@pytest.mark.parametrize("overrides, message", [
    (["engine.pipeline_parallel_size=2"], r"^engine.async_scheduling: true is not simulated with pipeline"),
    (["cluster.num_replicas=2", "cluster.prefill_replicas=1"],
     r"^engine.async_scheduling: true is not simulated in a disaggregated cluster"),
])
def test_what_async_scheduling_is_not_simulated_with_is_refused_by_field(overrides, message):
    with pytest.raises(SetupError, match=message):
        build_setup(chat("engine.async_scheduling=true", *overrides))


def test_a_calibrated_profile_and_a_real_run_refuse_async_scheduling(capsys):
    from sim.run import main as sim_run_main

    workload = load_workload(example_path("cpu_chat"), overrides=["engine.async_scheduling=true"])
    with pytest.raises(SetupError, match=r"^engine.async_scheduling: true needs the analytical cost model"):
        build_setup(workload, str(SHIPPED_PROFILES_DIR / "cpu-small-float32.json"))
    assert sim_run_main(["chat", "--executor", "real", "--set", "engine.async_scheduling=true", "--no-progress"]) == 2
    assert "engine.async_scheduling: true is simulated only" in capsys.readouterr().err


def test_completions_that_evict_each_other_still_get_ahead_under_async_scheduling():
    # Preempted with a token in flight, a request keeps that token while it waits (as vLLM does); when it was
    # dropped, completions that evict each other lost it every time and never got ahead.
    overrides = ["workload.num_requests=10", "workload.arrival.rate=1000", "model=mistral-7b", "hardware=l4",
                 "engine.num_gpu_blocks=40", "engine.block_size=32", "engine.scheduling_policy=priority",
                 "engine.max_num_batched_tokens=256", "workload.n=2", "engine.enable_prefix_caching=false"]
    for async_scheduling in (False, True):
        workload = chat(*overrides, f"engine.async_scheduling={str(async_scheduling).lower()}")
        serve_whole_outputs(workload, max_in_flight=2 if async_scheduling else 1)
