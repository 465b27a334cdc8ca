"""Real runs whose requests share a whole prompt replay exactly in the simulator.

On the real engine, requests with one prompt sample different tokens, so only their prompt blocks are
shared: the completions of one prompt (``workload.n``) and separate requests that repeat a prompt (a
trace's repeated hash ids, a shared prefix that is the whole prompt). The simulator must not make their
outputs alike, or a preempted request recomputes its output from another's cached blocks and the
replay takes other decisions than the real run. Each run is small enough to take seconds, and is
sized so that requests are preempted while others' outputs sit in the prefix cache.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from analysis import requests_table, steps_table  # noqa: E402
from sim.real_engine import build_real_engine  # noqa: E402
from sim.real_run import run_real  # noqa: E402
from sim.replay import compare_replay, replay  # noqa: E402
from workloads import load_workload  # noqa: E402

ENGINE = {"block_size": 16, "num_gpu_blocks": 40, "max_num_batched_tokens": 256, "max_model_len": 512,
          "enable_prefix_caching": True}
NUM_REPEATS = 24


def assert_real_run_replays(workload, tmp_path) -> None:
    real = build_real_engine(workload, model="tiny", threads=1)
    run_dir = tmp_path / "run"
    run_real(workload, run_dir, real.engine, vocab_size=real.vocab_size,
             reserved_token_ids=real.reserved_token_ids, executor_info=real.info)
    recorder, run, cost_model = replay(run_dir)
    assert run.steps["num_preemptions"].sum() > 0
    report = compare_replay(run, requests_table(recorder.request_columns()).to_pandas(),
                            steps_table(recorder.step_columns()).to_pandas())
    assert cost_model.finished
    assert report.identical, report.describe()


def test_completions_of_one_prompt(tmp_path):
    # Eight prompts of two completions each in a pool of 40 blocks.
    assert_real_run_replays(load_workload({
        "name": "tiny-real-n", "seed": 3, "model": "tiny", "hardware": "cpu", "dtype": "float32",
        "engine": {**ENGINE, "max_num_seqs": 8},
        "workload": {"num_requests": 8, "n": 2, "arrival": {"type": "poisson", "rate": 100},
                     "prompt_len": {"type": "uniform", "min": 20, "max": 60},
                     "output_len": {"type": "uniform", "min": 40, "max": 120}},
    }), tmp_path)


def test_requests_that_repeat_one_prompt(tmp_path):
    # Mooncake rows that all name the same block: 24 requests with the same 40-token prompt, 3-7 blocks each.
    trace = tmp_path / "same_prompt.jsonl"
    with open(trace, "w") as handle:
        for index in range(NUM_REPEATS):
            handle.write(json.dumps({"timestamp": 0, "input_length": 40, "output_length": 40 + 7 * index % 50,
                                     "hash_ids": [0]}) + "\n")
    assert_real_run_replays(load_workload({
        "name": "tiny-real-same-prompt", "seed": 3, "model": "tiny", "hardware": "cpu", "dtype": "float32",
        "engine": {**ENGINE, "max_num_seqs": 12},
        "workload": {"num_requests": NUM_REPEATS, "arrival": {"type": "trace"}, "prompt_len": {"type": "trace"},
                     "output_len": {"type": "trace"}, "trace": {"path": str(trace), "format": "mooncake"}},
    }), tmp_path)
