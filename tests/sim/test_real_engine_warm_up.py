"""A real engine that serves shorter sequences than the warm-up's longest prompt still warms up, and its
run replays exactly: the warm-up cuts its prompts to what the engine serves."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from analysis import requests_table, steps_table  # noqa: E402
from sim.real_engine import build_real_engine  # noqa: E402
from sim.real_run import run_real  # noqa: E402
from sim.replay import compare_replay, replay  # noqa: E402
from workloads import load_workload  # noqa: E402


# The engine's limit comes from max_model_len (256), or from a KV cache of 17 usable blocks (272 tokens).
@pytest.mark.parametrize("engine", [{"max_model_len": 256, "num_gpu_blocks": 64},
                                    {"max_model_len": 512, "num_gpu_blocks": 18}])
def test_an_engine_serving_short_sequences_warms_up_and_its_run_replays(tmp_path, engine):
    workload = load_workload({
        "name": "tiny-real-short", "seed": 4, "model": "tiny", "hardware": "cpu", "dtype": "float32",
        "engine": {"block_size": 16, "max_num_seqs": 4, "max_num_batched_tokens": 64, **engine},
        "workload": {"num_requests": 6, "arrival": {"type": "poisson", "rate": 100},
                     "prompt_len": {"type": "uniform", "min": 20, "max": 200},
                     "output_len": {"type": "uniform", "min": 1, "max": 40}},
    })
    real = build_real_engine(workload, model="tiny", threads=1)
    run_real(workload, tmp_path / "run", real.engine, vocab_size=real.vocab_size,
             reserved_token_ids=real.reserved_token_ids, executor_info=real.info)
    recorder, run, cost_model = replay(tmp_path / "run")
    assert run.summary["num_finished"] == 6
    report = compare_replay(run, requests_table(recorder.request_columns()).to_pandas(),
                            steps_table(recorder.step_columns()).to_pandas())
    assert cost_model.finished
    assert report.identical, report.describe()
