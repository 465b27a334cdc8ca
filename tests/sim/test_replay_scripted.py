"""Replay of a wall-clock run made with the model-free scripted executor (no torch needed).

The wall-clock driver and the simulator must take identical decisions when the simulator is given
the recorded step durations: same requests and token counts in every step, same preemptions, same
timestamps up to float rounding. The workload exercises chunked prefill, prefix caching and
preemption. tests/runner has the same test with the real model runner.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pandas as pd

from analysis import read_run, requests_table, steps_table
from engine.core import CacheConfig, EngineCore, Scheduler, SchedulerConfig, ScriptedExecutor
from sim.real_run import run_real
from sim.replay import compare_replay, replay
from workloads import load_workload

WORKLOAD = {
    "name": "replay-check", "seed": 3, "model": "tiny",
    "engine": {"block_size": 16, "num_gpu_blocks": 48, "max_num_seqs": 16, "max_num_batched_tokens": 96,
               "max_model_len": 1024, "long_prefill_token_threshold": 64, "enable_prefix_caching": True},
    "workload": {"num_requests": 50, "arrival": {"type": "poisson", "rate": 150},
                 "prompt_len": {"type": "uniform", "min": 40, "max": 220},
                 "output_len": {"type": "uniform", "min": 10, "max": 50},
                 "shared_prefix": {"num_groups": 3, "prefix_len": 32, "fraction": 0.6}},
}


class SlowScriptedExecutor(ScriptedExecutor):
    """Steps of a couple of milliseconds, so that requests overlap as they would on a model."""

    def execute_model(self, scheduler_output):
        time.sleep(0.0015)
        return super().execute_model(scheduler_output)


def test_replaying_a_wall_clock_run_reproduces_every_decision(tmp_path):
    workload = load_workload(WORKLOAD)
    engine = EngineCore(
        Scheduler(SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=96, max_model_len=1024,
                                  long_prefill_token_threshold=64),
                  CacheConfig(block_size=16, num_gpu_blocks=48, enable_prefix_caching=True)),
        SlowScriptedExecutor(vocab_size=1000))
    real = run_real(workload, tmp_path / "real", engine, vocab_size=1000, reserved_token_ids=[0, 1, 2])
    real_run = read_run(tmp_path / "real")
    steps = real_run.steps
    assert real.summary["num_finished"] == 50
    assert (steps["num_prefill_reqs"] > 0).sum() > 5 and (steps["num_prefill_tokens"] == 96).any()  # chunked
    assert steps["prefix_hit_tokens"].sum() > 0
    assert steps["num_preemptions"].sum() > 0

    recorder, run, cost_model = replay(tmp_path / "real")
    assert cost_model.finished
    report = compare_replay(run, requests_table(recorder.request_columns()).to_pandas(),
                            steps_table(recorder.step_columns()).to_pandas())
    assert report.identical, report.describe()


def test_the_cli_names_the_step_a_replay_diverged_at(tmp_path, capsys):
    from sim.run import main as run_main

    shipped = Path(__file__).resolve().parents[2] / "sim" / "data" / "runs" / "cpu-small-float32" / "cpu-long-prompts"
    recording = tmp_path / "altered"
    shutil.copytree(shipped, recording)
    steps = pd.read_parquet(recording / "steps.parquet")
    steps.loc[steps["step"] == 3, "num_scheduled_tokens"] += 1
    steps.to_parquet(recording / "steps.parquet")
    assert run_main(["--replay", str(recording), "--out", str(tmp_path / "replay"), "--no-dashboard", "--quiet"]) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert "replay DIVERGED: step 3: the simulation scheduled" in " ".join(captured.out.split())
