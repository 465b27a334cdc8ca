"""Multi-turn sessions on the real model runner (the generated tiny model, CPU): each later turn resends the
tokens the model generated, and a replay of the run takes exactly the same decisions."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from analysis import read_run, requests_table, steps_table  # noqa: E402
from sim.real_engine import build_real_engine  # noqa: E402
from sim.real_run import run_real  # noqa: E402
from sim.replay import compare_replay, replay  # noqa: E402
from workloads import load_workload  # noqa: E402

WORKLOAD = {
    "name": "tiny-sessions", "seed": 9, "model": "tiny", "hardware": "cpu", "dtype": "float32",
    "engine": {"block_size": 16, "num_gpu_blocks": 64, "max_num_seqs": 8, "max_num_batched_tokens": 64,
               "max_model_len": 512, "enable_prefix_caching": True},
    "workload": {"num_requests": 6, "arrival": {"type": "poisson", "rate": 40},
                 "prompt_len": {"type": "uniform", "min": 20, "max": 80},
                 "output_len": {"type": "uniform", "min": 4, "max": 24},
                 "sessions": {"turns": {"type": "constant", "value": 3},
                              "user_len": {"type": "uniform", "min": 4, "max": 30},
                              "think_time_s": {"type": "exponential", "mean": 0.02}}},
}


@pytest.mark.filterwarnings("ignore:.*other processes kept", "ignore:.*on a CPU for only")
def test_later_turns_resend_the_models_tokens_and_replay_exactly(tmp_path):
    workload = load_workload(WORKLOAD)
    real = build_real_engine(workload, model="tiny", threads=1)
    added = {}
    add_request = real.engine.add_request
    real.engine.add_request = lambda request: (added.__setitem__(request.request_id, request), add_request(request))[1]
    result = run_real(workload, tmp_path / "real", real.engine, vocab_size=real.vocab_size,
                      reserved_token_ids=real.reserved_token_ids, executor_info=real.info)
    assert result.summary["num_finished"] == 18 and result.summary["sessions"]["num_sessions"] == 6
    for first in [request_id for request_id in added if "-turn" not in request_id]:
        second, third = added[f"{first}-turn2"], added[f"{first}-turn3"]
        for before, after in ((added[first], second), (second, third)):
            history = list(before.all_token_ids)
            assert len(history) == before.num_prompt_tokens + before.max_tokens
            assert list(after.prompt_token_ids[:len(history)]) == history
    manager = real.engine.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks

    recorder, run, _ = replay(tmp_path / "real")
    report = compare_replay(run, requests_table(recorder.request_columns()).to_pandas(),
                            steps_table(recorder.step_columns()).to_pandas())
    assert report.identical, report.describe()
    assert (read_run(tmp_path / "real").requests.query("turn > 1")["num_cached_tokens"] > 0).all()
