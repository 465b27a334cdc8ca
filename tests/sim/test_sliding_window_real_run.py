"""A real run of a sliding-window checkpoint (CPU) and its replay: the engine hands back the blocks that leave
each request's window while it runs, and the simulator, driving the same core with the recorded cache config,
takes exactly the same decisions."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from analysis import read_run, requests_table, steps_table  # noqa: E402
from engine.core.kv_cache_manager import KVCacheManager  # noqa: E402
from engine.models import make_test_model  # noqa: E402
from sim.real_engine import build_real_engine  # noqa: E402
from sim.real_run import run_real  # noqa: E402
from sim.replay import compare_replay, replay  # noqa: E402
from workloads import load_workload  # noqa: E402

WINDOW = 24
WORKLOAD = {
    "name": "tiny-window", "seed": 9, "model": "tiny", "hardware": "cpu", "dtype": "float32",
    "engine": {"block_size": 16, "num_gpu_blocks": 48, "max_num_seqs": 8, "max_num_batched_tokens": 64,
               "max_model_len": 512, "enable_prefix_caching": True},
    "workload": {"num_requests": 16, "arrival": {"type": "poisson", "rate": 100},
                 "prompt_len": {"type": "uniform", "min": 40, "max": 160},
                 "output_len": {"type": "uniform", "min": 10, "max": 40},
                 "shared_prefix": {"num_groups": 2, "prefix_len": 48, "fraction": 0.5}},
}


def test_a_windowed_real_run_frees_out_of_window_blocks_and_replays_exactly(tmp_path, monkeypatch):
    checkpoint = make_test_model(tmp_path / "mistral", "mistral", num_hidden_layers=1, hidden_size=32,
                                 intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                                 with_tokenizer=True)
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "sliding_window": WINDOW}))
    skipped = []
    free_out_of_window = KVCacheManager.free_blocks_out_of_window

    def counting(manager, request):
        before = manager.num_skipped_block[request.request_id]
        free_out_of_window(manager, request)
        skipped.append(manager.num_skipped_block[request.request_id] - before)

    monkeypatch.setattr(KVCacheManager, "free_blocks_out_of_window", counting)
    workload = load_workload(WORKLOAD)
    real = build_real_engine(workload, model=str(checkpoint), threads=1)
    assert real.engine.scheduler.cache_config.sliding_window == WINDOW
    out = tmp_path / "real"
    result = run_real(workload, out, real.engine, vocab_size=real.vocab_size,
                      reserved_token_ids=real.reserved_token_ids, executor_info=real.info)
    assert result.summary["num_finished"] == 16 and sum(skipped) > 0
    manager = real.engine.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks
    run = read_run(out)
    assert run.summary["config"]["cache"]["sliding_window"] == WINDOW

    recorder, run, cost_model = replay(out)
    report = compare_replay(run, requests_table(recorder.request_columns()).to_pandas(),
                            steps_table(recorder.step_columns()).to_pandas())
    assert cost_model.finished
    assert report.identical, report.describe()
    # Attention reads only windows, in the recording and in its replay alike.
    assert (run.steps["decode_context_tokens"] <= WINDOW * run.steps["num_decode_reqs"]).all()


def test_a_hybrid_real_run_keeps_a_table_per_group_and_replays_exactly(tmp_path):
    """Qwen2 with one full and one windowed layer: the real engine gets vLLM's hybrid KV cache (a table per group,
    the windowed group handing blocks back), records its groups, and the replay rebuilds the same cache and takes
    exactly the same decisions; turned off, the engine keeps one table."""
    from engine.core.hybrid_kv_cache_manager import HybridKVCacheManager

    checkpoint = make_test_model(tmp_path / "qwen2", "qwen2", num_hidden_layers=2, hidden_size=32,
                                 intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                                 with_tokenizer=True)
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "sliding_window": WINDOW, "use_sliding_window": True,
                                                        "max_window_layers": 1}))
    workload = load_workload(WORKLOAD)
    real = build_real_engine(workload, model=str(checkpoint), threads=1)
    manager = real.engine.scheduler.kv_cache_manager
    assert isinstance(manager, HybridKVCacheManager) and manager.group_windows == (None, WINDOW)
    out = tmp_path / "real"
    result = run_real(workload, out, real.engine, vocab_size=real.vocab_size,
                      reserved_token_ids=real.reserved_token_ids, executor_info=real.info)
    assert result.summary["num_finished"] == 16
    assert manager.num_free_blocks == manager.num_usable_blocks
    run = read_run(out)
    assert run.summary["config"]["cache"]["kv_cache_groups"] == [None, WINDOW]
    recorder, run, cost_model = replay(out)
    report = compare_replay(run, requests_table(recorder.request_columns()).to_pandas(),
                            steps_table(recorder.step_columns()).to_pandas())
    assert cost_model.finished
    assert report.identical, report.describe()
    single = load_workload({**WORKLOAD, "engine": {**WORKLOAD["engine"], "disable_hybrid_kv_cache_manager": True}})
    one_table = build_real_engine(single, model=str(checkpoint), threads=1)
    assert one_table.engine.scheduler.cache_config.kv_cache_groups is None
