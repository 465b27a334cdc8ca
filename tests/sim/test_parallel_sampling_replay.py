"""A real run of a workload with ``n`` completions per prompt replays exactly in the simulator.

The real engine's completions of one prompt sample different tokens, so only their prompt blocks are
shared; the simulator must not make their outputs alike either, or a preempted completion recomputes
its output from its sibling's cached blocks and the replay takes other decisions than the real run.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from analysis import requests_table, steps_table  # noqa: E402
from sim.real_engine import build_real_engine  # noqa: E402
from sim.real_run import run_real  # noqa: E402
from sim.replay import compare_replay, replay  # noqa: E402
from workloads import load_workload  # noqa: E402

# Eight prompts of two completions each in a pool of 40 blocks: completions are preempted while their
# siblings' outputs sit in the prefix cache.
WORKLOAD = {
    "name": "tiny-real-n", "seed": 3, "model": "tiny", "hardware": "cpu", "dtype": "float32",
    "engine": {"block_size": 16, "num_gpu_blocks": 40, "max_num_seqs": 8, "max_num_batched_tokens": 256,
               "max_model_len": 512, "enable_prefix_caching": True},
    "workload": {"num_requests": 8, "n": 2, "arrival": {"type": "poisson", "rate": 100},
                 "prompt_len": {"type": "uniform", "min": 20, "max": 60},
                 "output_len": {"type": "uniform", "min": 40, "max": 120}},
}


def test_replay_of_a_real_parallel_sampling_run_takes_the_same_decisions(tmp_path):
    workload = load_workload(WORKLOAD)
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
