"""Pipeline parallelism in the simulator: vLLM's layer partition, each stage's memory and time, and the
engine loop that keeps a batch per stage in flight through the shared scheduler."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.core import EngineCore, Scheduler
from sim.cost_models import AnalyticalCostModel
from sim.cost_models.step_batch import StepBatch, step_features
from sim.engine_setup import SetupError, build_setup
from sim.hardware import resolve_hardware
from sim.model_presets import resolve_model
from sim.kv_cache_capacity import kv_cache_num_blocks
from sim.pipeline_stages import PipelineStages, pipelined_engine_loop
from sim.profile_match import SHIPPED_PROFILES_DIR
from sim.sim_executor import SimulatedExecutor
from sim.simulator import Simulation
from tests.core.helpers import check_scheduler_invariants
from tests.sim.test_cluster import chat, tables
from workloads import load_workload, example_path


def mixed_batch() -> StepBatch:
    """Forty decodes at 1,000 tokens of context beside a 512-token chunk after 256 cached tokens."""
    return StepBatch(num_scheduled_tokens=[1] * 40 + [512], num_computed_tokens=[1000] * 40 + [256])


def test_layers_are_split_as_vllm_splits_them_the_remainder_before_the_last_stage():
    model = resolve_model("llama-3.1-8b")  # 32 layers
    assert model.pipeline_stage_layers(1) == [32]
    assert model.pipeline_stage_layers(4) == [8, 8, 8, 8]
    assert model.pipeline_stage_layers(3) == [11, 11, 10]
    assert model.pipeline_stage_layers(5) == [6, 6, 7, 7, 6]
    with pytest.raises(ValueError, match="engine.pipeline_parallel_size: 33 stages, but model .* has only 32 layers"):
        model.pipeline_stage_layers(33)


@pytest.mark.parametrize("model_name", ["llama-3.1-8b", "qwen2-0.5b"])
def test_the_stages_hold_every_weight_once_but_tied_embeddings_twice(model_name):
    model = resolve_model(model_name)
    whole = model.weight_bytes("bfloat16")
    assert model.pipeline_stage_weight_bytes(0, 1, "bfloat16") == whole
    split = sum(model.pipeline_stage_weight_bytes(stage, 3, "bfloat16") for stage in range(3))
    # Tied embeddings (qwen2-0.5b) are one tensor on one GPU; the first and last stages each need a copy.
    extra = model.vocab_size * model.hidden_size * 2 if model.tied_embeddings else 0
    assert split == whole + extra
    assert model.pipeline_stage_weight_bytes(0, 1, "bfloat16", "fp8") == model.weight_bytes("bfloat16", "fp8")


def test_the_pool_is_what_the_tightest_stage_fits_and_two_stages_hold_a_model_one_gpu_cannot():
    model, hardware = resolve_model("llama-2-70b"), resolve_hardware("h100-sxm")
    with pytest.raises(ValueError, match="more tensor or pipeline parallelism"):
        kv_cache_num_blocks(model, hardware, "bfloat16", 16, 0.9)
    blocks = kv_cache_num_blocks(model, hardware, "bfloat16", 16, 0.9, pipeline_parallel_size=2)
    # By hand: each stage's free memory over its layers' share of a block; the smaller count wins.
    usable, reserve = hardware.memory_bytes * 0.9, hardware.memory_bytes * 0.03
    per_layer_block = 16 * model.kv_bytes_per_token_per_layer("bfloat16")
    expected = min((usable - reserve - model.pipeline_stage_weight_bytes(stage, 2, "bfloat16")) // (layers * per_layer_block)
                   for stage, layers in enumerate(model.pipeline_stage_layers(2)))
    assert blocks == expected > 1000
    # One stage is the model on one GPU: the same count as before pipelines existed.
    small = resolve_model("llama-3.1-8b")
    one = kv_cache_num_blocks(small, hardware, "bfloat16", 16, 0.9, pipeline_parallel_size=1)
    assert one == int((usable - small.weight_bytes("bfloat16") - reserve) // (16 * small.kv_bytes_per_token("bfloat16")))


def test_the_stages_split_a_steps_time_and_add_only_the_hand_over_between_them():
    model, hardware = resolve_model("llama-3.1-8b"), resolve_hardware("h100-sxm")
    features = step_features(mixed_batch())
    one = AnalyticalCostModel(model, hardware, "bfloat16")
    (alone,) = one.pipeline_stage_times(features)
    assert one.engine_overhead_s(features) + alone == pytest.approx(one.step_time_from_features(features), rel=1e-12)
    four = AnalyticalCostModel(model, hardware, "bfloat16", pipeline_parallel_size=4)
    stages = four.pipeline_stage_times(features)
    latency, per_byte = hardware.send_coefficients()
    send = latency + 552 * 2 * model.hidden_size * 2 * per_byte  # 552 tokens of hidden states and residual, bf16
    assert sum(stages) == pytest.approx(alone + 3 * send, rel=1e-12)
    # Equal layers, so the first three stages are equal; the last also runs lm_head and sampling, and sends nothing.
    assert stages[0] == stages[1] == stages[2] < stages[3]
    assert four.step_time_from_features(features) == pytest.approx(
        four.engine_overhead_s(features) + sum(stages), rel=1e-12)
    assert four.describe()["pipeline_stage_layers"] == [8, 8, 8, 8]
    assert four.step_time(mixed_batch()) == four.step_time_from_features(features)


def test_with_tensor_parallelism_each_gpu_sends_its_share_and_the_next_stage_gathers_it():
    model, hardware = resolve_model("llama-3.1-8b"), resolve_hardware("h100-sxm")
    features = step_features(mixed_batch())
    (alone,) = AnalyticalCostModel(model, hardware, "bfloat16", tensor_parallel_size=2).pipeline_stage_times(features)
    stages = AnalyticalCostModel(model, hardware, "bfloat16", tensor_parallel_size=2,
                                 pipeline_parallel_size=2).pipeline_stage_times(features)
    rows = 552 * 2 * model.hidden_size * 2  # bytes of hidden states and residual, bfloat16
    latency, per_byte = hardware.send_coefficients()
    gather_latency, allreduce_per_byte = hardware.allreduce_coefficients(2)
    send = latency + rows / 2 * per_byte + gather_latency + rows / 2 * allreduce_per_byte
    assert sum(stages) == pytest.approx(alone + send, rel=1e-12)


def test_a_batch_enters_each_stage_when_it_has_left_the_last_and_the_stage_is_free():
    stages = PipelineStages(2)
    assert stages.run(0.0, [1.0, 1.0]) == 2.0
    assert stages.run(0.5, [1.0, 1.0]) == 3.0   # waits for stage 0 until 1.0, then for stage 1 until 2.0
    assert stages.run(5.0, [0.25, 0.5]) == 5.75  # both free by then
    with pytest.raises(ValueError, match="3 stage times for a pipeline of 2 stages"):
        stages.run(6.0, [1.0, 1.0, 1.0])


class _PipelinedAtDepthOne(Simulation):
    """Every replica runs the pipelined loop, even with one stage."""

    def _engine_loop(self, index, replica):
        return pipelined_engine_loop(self, replica, replica.executor.cost_model)


def _engine(setup):
    return EngineCore(Scheduler(setup.scheduler_config, setup.cache_config), SimulatedExecutor(setup.cost_model))


def test_the_pipelined_loop_with_one_stage_is_the_ordinary_engine_loop():
    workload = chat("workload.arrival.rate=30", "engine.num_gpu_blocks=300", "engine.max_model_len=2048")
    setup = build_setup(workload)
    assert workload.engine.pipeline_parallel_size == 1
    ordinary = tables(Simulation(_engine(setup), setup.requests, fast_forward=False).run())
    pipelined = tables(_PipelinedAtDepthOne(_engine(setup), setup.requests, fast_forward=False).run())
    # A pipelined row snapshots the pool as its batch is scheduled, before its outputs free the requests that
    # finish in it; the ordinary loop applies a step's outputs at its start, so its row comes after them.
    steps, piped_steps = ordinary[1], pipelined[1]
    finishing = piped_steps["num_running"] - steps["num_running"]
    assert (finishing >= 0).all() and finishing.sum() == (ordinary[0]["finish_reason"] == "length").sum()
    assert (piped_steps["kv_blocks_used"] >= steps["kv_blocks_used"]).all()
    for plain, piped in zip(ordinary, pipelined):
        assert list(plain.columns) == list(piped.columns) and len(plain) == len(piped)
        for column in plain.columns.drop(["num_running", "kv_blocks_used", "kv_usage"], errors="ignore"):
            if plain[column].dtype.kind == "f":
                np.testing.assert_allclose(piped[column], plain[column], rtol=1e-9, atol=1e-12, err_msg=column)
            elif column == "token_times":
                for times, piped_times in zip(plain[column], piped[column]):
                    np.testing.assert_allclose(piped_times, times, rtol=1e-9, atol=1e-12)
            else:
                assert plain[column].tolist() == piped[column].tolist(), column
    assert ordinary[1]["num_preemptions"].sum() > 0  # the comparison covers preemption


def _in_flight_at_each_start(steps) -> list[int]:
    """Rows running at each row's start. A row's end is start + duration, which may land an ulp past the time
    its batch came back: a row that ends within a nanosecond of a start counts as ended."""
    starts = steps["start_time"].to_numpy()
    ends = starts + steps["duration"].to_numpy()
    return [int(((starts <= start) & (ends > start + 1e-9)).sum()) for start in starts]


def test_two_stages_keep_two_batches_in_flight_and_split_the_running_requests_between_them():
    workload = chat("workload.arrival.rate=20", "engine.pipeline_parallel_size=2", "workload.num_requests=200")
    setup = build_setup(workload)
    engine = _engine(setup)
    requests, steps = tables(Simulation(engine, setup.requests).run())
    in_flight = _in_flight_at_each_start(steps)
    assert max(in_flight) == 2 and in_flight.count(2) > len(in_flight) // 2
    # Every request produced its whole output, and nothing is left held.
    assert (requests["finish_reason"] == "length").all()
    output_len = {spec.request_id: spec.output_len for spec in setup.requests}
    assert (requests["num_output_tokens"] == requests["request_id"].map(output_len)).all()
    # A decode waits for its own token: no request is in two batches in flight, so the batches split them.
    assert steps["num_decode_reqs"].max() < requests["num_output_tokens"].size
    manager = engine.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks


def test_more_stages_give_tokens_sooner_at_the_same_load_and_cost_more_gpus():
    base = ["workload.arrival.rate=20", "workload.num_requests=200"]
    results = {}
    for stages in (1, 2):
        setup = build_setup(chat(*base, f"engine.pipeline_parallel_size={stages}"))
        requests, steps = tables(Simulation(_engine(setup), setup.requests).run())
        served = requests[requests["finish_reason"] == "length"]
        results[stages] = float(((served["finish_time"] - served["first_token_time"])
                                 / (served["num_output_tokens"] - 1).clip(lower=1)).median())
    assert results[2] < results[1]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stages=st.integers(2, 4), rate=st.sampled_from([5, 60]), num_gpu_blocks=st.sampled_from([120, 3000]),
       policy=st.sampled_from(["fcfs", "priority"]), chunked=st.booleans(), seed=st.integers(0, 3))
def test_every_request_is_served_with_its_whole_output_under_any_pressure(stages, rate, num_gpu_blocks, policy,
                                                                           chunked, seed):
    workload = chat("workload.num_requests=40", f"engine.pipeline_parallel_size={stages}",
                    f"workload.arrival.rate={rate}", f"engine.num_gpu_blocks={num_gpu_blocks}",
                    "engine.max_model_len=2048", f"engine.scheduling_policy={policy}",
                    f"engine.enable_chunked_prefill={str(chunked).lower()}", "engine.max_num_batched_tokens=2048",
                    f"seed={seed}")
    serve_whole_outputs(workload, max_in_flight=stages)


def serve_whole_outputs(workload, max_in_flight: int) -> None:
    """Simulate: every request served once, with its whole output (or what room its prompt leaves under the
    engine's length limit), at most ``max_in_flight`` batches at a time, every block back at the end."""
    setup = build_setup(workload)
    engine = _engine(setup)
    requests, steps = tables(Simulation(engine, setup.requests).run())
    assert sorted(requests["request_id"]) == sorted(spec.request_id for spec in setup.requests)
    room = engine.scheduler.max_model_len
    output_len = {spec.request_id: min(spec.output_len, room - len(spec.prompt_token_ids)) for spec in setup.requests}
    served = requests[requests["finish_reason"] == "length"]
    assert requests["finish_reason"].isin(["length", "ignored"]).all()
    assert all(served["num_output_tokens"] == served["request_id"].map(output_len))
    assert max(_in_flight_at_each_start(steps)) <= max_in_flight
    check_scheduler_invariants(engine.scheduler)
    manager = engine.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks and not engine.has_work()


def simulates_identically_twice(workload) -> None:
    first, second = (tables(Simulation(_engine(build_setup(workload)), build_setup(workload).requests).run())
                     for _ in range(2))
    for a, b in zip(first, second):
        assert a.equals(b)


def test_a_pipelined_run_is_deterministic():
    simulates_identically_twice(chat("workload.arrival.rate=40", "engine.pipeline_parallel_size=3",
                                     "workload.num_requests=120", "engine.num_gpu_blocks=200",
                                     "engine.max_model_len=2048"))


@pytest.mark.parametrize("overrides, message", [
    (["engine.pipeline_parallel_size=33"], r"^engine.pipeline_parallel_size: 33 stages, but model"),
    (["engine.pipeline_parallel_size=2", "cluster.num_replicas=2", "cluster.prefill_replicas=1"],
     r"^engine.pipeline_parallel_size: 2 stages are not simulated in a disaggregated cluster"),
])
def test_an_impossible_pipeline_is_refused_by_field(overrides, message):
    with pytest.raises(SetupError, match=message):
        build_setup(chat(*overrides))


def test_a_calibrated_profile_and_a_real_run_refuse_pipeline_stages(capsys):
    from sim.run import main as sim_run_main

    workload = load_workload(example_path("cpu_chat"), overrides=["engine.pipeline_parallel_size=2"])
    with pytest.raises(SetupError, match=r"^engine.pipeline_parallel_size: 2 needs the analytical cost model"):
        build_setup(workload, str(SHIPPED_PROFILES_DIR / "cpu-small-float32.json"))
    assert sim_run_main(["chat", "--executor", "real", "--set", "engine.pipeline_parallel_size=2",
                         "--no-progress"]) == 2
    assert "engine.pipeline_parallel_size: 2 stages run in the simulator only" in capsys.readouterr().err


def test_the_parallelism_example_decodes_fastest_with_tensor_parallelism_at_a_moderate_rate(tmp_path):
    from analysis import compute_summary

    workload = load_workload(example_path("parallelism"), overrides=["workload.num_requests=200"])
    tpot = {}
    for label, point in workload.sweep_points():
        if point.workload.arrival.rate != 2:
            continue
        setup = build_setup(point)
        requests, steps = tables(Simulation(_engine(setup), setup.requests).run())
        tpot[label] = compute_summary(requests, steps, name=label, mode="sim", config={})["tpot_ms"]["p50"]
    assert list(tpot) == ["rate=2,engine=tensor_parallel_size=4",
                          "rate=2,engine=tensor_parallel_size=2+pipeline_parallel_size=2",
                          "rate=2,engine=pipeline_parallel_size=4"]
    assert sorted(tpot.values()) == list(tpot.values())


def test_a_sweep_with_a_point_that_cannot_run_is_refused_before_any_point_runs(tmp_path, capsys):
    from sim.run import main as sim_run_main

    out = tmp_path / "sweep"
    assert sim_run_main(["disaggregation", "--set", "engine.pipeline_parallel_size=2", "--set",
                         "workload.num_requests=50", "--out", str(out), "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert "sweep point prefill_replicas=1: engine.pipeline_parallel_size: 2 stages" in error
    assert not out.exists()
