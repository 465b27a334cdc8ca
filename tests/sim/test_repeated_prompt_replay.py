"""A real run whose requests repeat one prompt replays exactly in the simulator.

Requests with the same prompt (a trace's repeated hash ids, a shared prefix that is the whole prompt)
sample different tokens on the real engine, so only their prompt blocks are shared. The simulator must
not make their outputs alike, or a preempted request recomputes its output from another request's
cached blocks and the replay takes other decisions than the real run. The same holds for the
completions of one prompt (test_parallel_sampling_replay.py); here every request is its own.
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

NUM_REQUESTS = 24


def write_trace(path) -> None:
    """Mooncake rows that all name the same block: every request has the same 40-token prompt."""
    with open(path, "w") as handle:
        for index in range(NUM_REQUESTS):
            handle.write(json.dumps({"timestamp": 0, "input_length": 40, "output_length": 40 + 7 * index % 50,
                                     "hash_ids": [0]}) + "\n")


def test_replay_of_a_real_run_of_one_repeated_prompt_takes_the_same_decisions(tmp_path):
    trace = tmp_path / "same_prompt.jsonl"
    write_trace(trace)
    # 24 requests of 3-7 blocks each in a pool of 40 blocks: requests are preempted while others' outputs,
    # following the same prompt, sit in the prefix cache.
    workload = load_workload({
        "name": "tiny-real-same-prompt", "seed": 3, "model": "tiny", "hardware": "cpu", "dtype": "float32",
        "engine": {"block_size": 16, "num_gpu_blocks": 40, "max_num_seqs": 12, "max_num_batched_tokens": 256,
                   "max_model_len": 512, "enable_prefix_caching": True},
        "workload": {"num_requests": NUM_REQUESTS, "arrival": {"type": "trace"}, "prompt_len": {"type": "trace"},
                     "output_len": {"type": "trace"}, "trace": {"path": str(trace), "format": "mooncake"}},
    })
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
