"""The SimPy simulator: determinism, queueing physics, prefix caching, load response, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analysis import read_run
from engine.core import CacheConfig, EngineCore, Scheduler, SchedulerConfig
from sim.cost_models import step_features
from sim.engine_setup import build_setup
from sim.run import main as sim_run_main
from sim.run_pipeline import run_simulation, simulate
from sim.scheduled_batch import scheduler_output_features, step_batch
from sim.sim_executor import SimulatedExecutor
from workloads import example_path, load_workload

SMALL_OVERRIDES = ["workload.num_requests=300"]


def small_chat(*overrides):
    return load_workload(example_path("chat"), overrides=[*SMALL_OVERRIDES, *overrides])


def test_a_fixed_seed_reproduces_identical_runs(tmp_path):
    first = run_simulation(small_chat(), tmp_path / "a")
    second = run_simulation(small_chat(), tmp_path / "b")
    a, b = read_run(tmp_path / "a"), read_run(tmp_path / "b")
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    for key in ("ttft_ms", "e2e_ms", "request_throughput", "num_preemptions"):
        assert first.summary[key] == second.summary[key]
    third = run_simulation(small_chat("seed=1"), tmp_path / "c")
    assert third.summary["e2e_ms"] != first.summary["e2e_ms"]


def test_every_request_gets_exactly_its_output_length():
    workload = small_chat()
    setup = build_setup(workload)
    recorder = simulate(setup)
    columns = recorder.request_columns()
    expected = {spec.request_id: spec.output_len for spec in setup.requests}
    produced = dict(zip(columns["request_id"], columns["num_output_tokens"]))
    assert produced == expected
    assert set(columns["finish_reason"]) == {"length"}
    times = columns["token_times"]
    assert all(np.all(np.diff(t) > 0) for t in times)
    assert all(t[0] >= arrival for t, arrival in zip(times, columns["arrival_time"]))


def test_littles_law_holds_on_a_long_run(tmp_path):
    workload = load_workload(example_path("chat"), overrides=[
        "workload.num_requests=3000", "workload.arrival.rate=25"])
    result = run_simulation(workload, tmp_path / "run")
    run = read_run(tmp_path / "run")
    requests, steps = run.requests, run.steps
    # Mean number in system from the step trace (running + waiting, time-weighted over each step)...
    start = requests["arrival_time"].min()
    window = (steps["start_time"] >= start + 20) & (steps["start_time"] < requests["finish_time"].max() - 20)
    in_system = ((steps["num_running"] + steps["num_waiting"]) * steps["duration"])[window].sum() / \
        steps["duration"][window].sum()
    # ... against arrival rate x mean time in system from the request trace.
    arrival_rate = (len(requests) - 1) / (requests["arrival_time"].max() - start)
    mean_time_in_system = (requests["finish_time"] - requests["arrival_time"]).mean()
    assert in_system == pytest.approx(arrival_rate * mean_time_in_system, rel=0.05)
    assert result.summary["num_finished"] == 3000


def test_prefix_caching_hits_the_expected_fraction():
    workload = load_workload({
        "name": "prefix", "model": "llama-2-7b", "hardware": "a100-80gb",
        "engine": {"block_size": 16, "max_model_len": 4096},
        "workload": {"num_requests": 400, "arrival": {"type": "poisson", "rate": 5},
                     "prompt_len": {"type": "constant", "value": 1000},
                     "output_len": {"type": "constant", "value": 20},
                     "shared_prefix": {"num_groups": 4, "prefix_len": 600, "fraction": 0.5}}})
    setup = build_setup(workload)
    recorder = simulate(setup)
    steps = recorder.step_columns()
    hit_rate = sum(steps["prefix_hit_tokens"]) / sum(steps["prefix_query_tokens"])
    grouped = sum(spec.prefix_group is not None for spec in setup.requests)
    # Each grouped request hits its prefix's full blocks (600 -> 592 tokens), except the first of each group.
    expected = (grouped - 4) * 592 / (400 * 1000)
    assert hit_rate == pytest.approx(expected, rel=0.05)
    assert 0.25 < hit_rate < 0.32  # about half the requests x 592/1000 of their prompt


def test_more_load_gives_monotonically_worse_latency(tmp_path):
    workload = load_workload(example_path("rate_sweep"), overrides=["workload.num_requests=300"])
    from sim.sweep import run_sweep
    results = run_sweep(workload, tmp_path / "sweep")
    e2e = [result.summary["e2e_ms"]["p50"] for result in results]
    ttft = [result.summary["ttft_ms"]["p90"] for result in results]
    assert len(results) >= 3
    assert all(later > earlier for earlier, later in zip(e2e, e2e[1:])), e2e
    assert all(later >= earlier for earlier, later in zip(ttft, ttft[1:])), ttft
    table = pd.read_csv(tmp_path / "sweep" / "sweep.csv")
    assert len(table) == len(results) and "ttft_ms_p99" in table.columns


def test_one_pass_features_equal_the_definition():
    setup = build_setup(small_chat("engine.max_num_batched_tokens=512", "engine.long_prefill_token_threshold=200"))
    engine = EngineCore(Scheduler(setup.scheduler_config, setup.cache_config), SimulatedExecutor(setup.cost_model))
    from sim.engine_requests import make_request
    params = {}
    for spec in setup.requests[:80]:
        engine.add_request(make_request(spec, params))
    checked = 0
    while engine.has_work():
        output = engine.scheduler.schedule()
        if output.total_num_scheduled_tokens:
            assert scheduler_output_features(output) == step_features(step_batch(output))
            checked += 1
        engine.scheduler.update_from_output(output, engine.executor.execute_model(output))
    assert checked > 10


def test_cli_runs_the_default_and_writes_a_run_directory(tmp_path, capsys):
    assert sim_run_main(["--set", "workload.num_requests=50", "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "TTFT" in printed and "requests/s" in printed
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["mode"] == "sim" and summary["num_finished"] == 50
    assert summary["config"]["cost_model"]["kind"] == "analytical"


@pytest.mark.parametrize("argv, fragment", [
    (["--set", "engine.block_size=12"], "engine.block_size"),
    (["--set", "workload.arrival.rate=-1"], "workload.arrival.rate"),
    (["--set", "model=gpt-9"], "model"),
    (["--set", "hardware=tpu-v9"], "hardware"),
    (["no/such/file.yaml"], "no/such/file.yaml"),
])
def test_cli_reports_bad_input_with_the_field_and_exit_code_2(argv, fragment, tmp_path, capsys):
    assert sim_run_main([*argv, "--out", str(tmp_path / "x"), "--no-progress"]) == 2
    assert fragment in capsys.readouterr().err


def test_a_pool_too_small_for_the_model_is_a_clear_error():
    from sim.engine_setup import SetupError
    with pytest.raises(SetupError, match="engine.gpu_memory_utilization"):
        build_setup(small_chat("hardware=l4", "model=llama-2-70b"))


def test_a_tiny_pool_preempts_and_still_finishes_everything(tmp_path):
    result = run_simulation(small_chat("engine.num_gpu_blocks=200", "engine.max_model_len=2048",
                                       "workload.arrival.rate=40"), tmp_path / "run")
    assert result.summary["num_preemptions"] > 0
    assert result.summary["num_finished"] == 300


def test_a_step_that_only_preempts_is_progress_not_a_stall(tmp_path, monkeypatch):
    """Under priority scheduling with a small pool, the running request that needs a block can be its own
    victim (the lowest priority): the step schedules no token but frees blocks, and the next one goes on,
    as in vLLM. The simulator used to call that a stall and stop with a traceback. The preemption is
    counted once, in the requests' and in the steps' tables alike."""
    from sim.trace_recorder import TraceRecorder

    empty_steps = []
    on_empty_step = TraceRecorder.on_empty_step
    monkeypatch.setattr(TraceRecorder, "on_empty_step",
                        lambda self, output: (empty_steps.append(1), on_empty_step(self, output)))
    workload = load_workload(example_path("priority"), overrides=["engine.num_gpu_blocks=400",
                                                                   "workload.num_requests=300"])
    result = run_simulation(workload, tmp_path / "run")
    assert empty_steps and result.summary["num_finished"] == 300
    run = read_run(tmp_path / "run")
    assert run.steps["num_preemptions"].sum() == run.requests["num_preemptions"].sum() == result.summary["num_preemptions"]


def test_without_max_model_len_requests_are_trimmed_to_the_models_own_limit(tmp_path):
    """engine.max_model_len null means the model's own limit (4,096 for the small preset), and prompt +
    output is trimmed to it as to a set max_model_len; the requests used to be generated untrimmed, and
    the engine then ignored the ones that did not fit."""
    workload = load_workload(example_path("chat"), overrides=[
        "model=small", "dtype=float32", "engine.max_model_len=null", "workload.num_requests=50",
        "workload.prompt_len={type: uniform, min: 3000, max: 6000}"])
    result = run_simulation(workload, tmp_path / "run")
    requests = read_run(tmp_path / "run").requests
    assert result.summary["num_ignored"] == 0 and result.summary["num_finished"] == 50
    assert (requests["num_prompt_tokens"] + requests["num_output_tokens"]).max() == 4096


def test_requests_a_pool_can_never_hold_are_ignored_with_the_reason(tmp_path, capsys):
    # 40 usable blocks of 16 tokens hold 640 tokens: the chat example's longer prompts can never run.
    argv = ["--set", "workload.num_requests=40", "--set", "engine.num_gpu_blocks=41", "--set", "engine.block_size=16",
            "--out", str(tmp_path / "run"), "--no-progress", "--no-dashboard"]
    assert sim_run_main(argv) == 0
    run = read_run(tmp_path / "run")
    ignored = run.requests[run.requests["finish_reason"] == "ignored"]
    served = run.requests[run.requests["finish_reason"] != "ignored"]
    assert len(ignored) > 0 and (ignored["num_prompt_tokens"] > 640).all()
    assert ignored["status_message"].str.contains("exceeds the KV cache capacity (40 blocks x 16 tokens)",
                                                  regex=False).all()
    assert len(served) > 0 and (served["finish_reason"] == "length").all() and served["status_message"].isna().all()
    examples = run.summary["ignored_examples"]
    first = ignored.sort_values("arrival_time").iloc[0]
    assert examples[0] == {"request_id": first["request_id"], "reason": first["status_message"]}
    assert len(examples) == min(3, len(ignored))
    printed = " ".join(capsys.readouterr().out.split())
    assert f"ignored requests, the first: {first['request_id']}: prompt length {first['num_prompt_tokens']}" in printed


def test_scheduler_configs_pass_through():
    setup = build_setup(small_chat("engine.max_num_seqs=7", "engine.scheduling_policy=priority"))
    assert isinstance(setup.scheduler_config, SchedulerConfig) and isinstance(setup.cache_config, CacheConfig)
    assert setup.scheduler_config.max_num_seqs == 7 and setup.scheduler_config.policy == "priority"


def test_parallel_sampling_completions_share_their_prompt_through_the_prefix_cache(tmp_path):
    # No shared prefixes: with n = 4 the only hits are completions 1..3 reading completion 0's prompt
    # blocks, which vLLM caches as they are allocated, so they hit even when admitted in the same step.
    overrides = ["workload.num_requests=60", "workload.shared_prefix=null", "workload.n=4",
                 "workload.prompt_len={type: uniform, min: 64, max: 512}"]
    summary = run_simulation(small_chat(*overrides), tmp_path / "n4").summary
    requests = read_run(tmp_path / "n4").requests
    assert summary["num_finished"] == 240
    cached = requests.set_index("request_id")["num_cached_tokens"]
    for prompt_index in range(60):
        first, *others = (cached[f"{i}_req-{prompt_index:06d}"] for i in range(4))
        assert first == 0 and all(value > 0 for value in others)
    assert summary["prefix_cache_hit_rate"] > 0.6
