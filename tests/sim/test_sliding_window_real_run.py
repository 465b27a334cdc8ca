"""Real runs of checkpoints whose layers read only part of the cache (CPU) and their replays: the engine hands back
the blocks that leave each request's window (or, for Llama 4's chunked layers, its current chunk) while it runs, and
the simulator, driving the same core with the recorded cache config, takes exactly the same decisions."""

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


def counted_hand_backs(monkeypatch) -> list[int]:
    """The blocks each call of KVCacheManager.free_blocks_out_of_window hands back, appended as the run goes."""
    handed_back = []
    free_out_of_window = KVCacheManager.free_blocks_out_of_window

    def counting(manager, request):
        before = manager.num_skipped_block[request.request_id]
        free_out_of_window(manager, request)
        handed_back.append(manager.num_skipped_block[request.request_id] - before)

    monkeypatch.setattr(KVCacheManager, "free_blocks_out_of_window", counting)
    return handed_back


def assert_replays_exactly(out):
    """The simulator driving the same core from the recording in ``out`` takes exactly the same decisions."""
    recorder, run, cost_model = replay(out)
    report = compare_replay(run, requests_table(recorder.request_columns()).to_pandas(),
                            steps_table(recorder.step_columns()).to_pandas())
    assert cost_model.finished
    assert report.identical, report.describe()
    return run


def test_a_windowed_real_run_frees_out_of_window_blocks_and_replays_exactly(tmp_path, monkeypatch):
    checkpoint = make_test_model(tmp_path / "mistral", "mistral", num_hidden_layers=1, hidden_size=32,
                                 intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                                 with_tokenizer=True)
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "sliding_window": WINDOW}))
    skipped = counted_hand_backs(monkeypatch)
    workload = load_workload(WORKLOAD)
    real = build_real_engine(workload, model=str(checkpoint), threads=1)
    assert real.engine.scheduler.cache_config.sliding_window == WINDOW
    out = tmp_path / "real"
    result = run_real(workload, out, real.engine, vocab_size=real.vocab_size,
                      reserved_token_ids=real.reserved_token_ids, executor_info=real.info)
    assert result.summary["num_finished"] == 16 and sum(skipped) > 0
    manager = real.engine.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks
    assert read_run(out).summary["config"]["cache"]["sliding_window"] == WINDOW
    run = assert_replays_exactly(out)
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
    assert read_run(out).summary["config"]["cache"]["kv_cache_groups"] == [None, WINDOW]
    assert_replays_exactly(out)
    single = load_workload({**WORKLOAD, "engine": {**WORKLOAD["engine"], "disable_hybrid_kv_cache_manager": True}})
    one_table = build_real_engine(single, model=str(checkpoint), threads=1)
    assert one_table.engine.scheduler.cache_config.kv_cache_groups is None


def test_a_llama4_real_run_hands_back_chunked_blocks_and_replays_exactly(tmp_path, monkeypatch):
    """Llama 4 (three layers in four chunked, a checkpoint transformers wrote) on the hybrid KV cache: the chunked
    groups hand back the blocks before each request's current chunk, and the recorded groups and chunk rebuild the
    same cache in the replay."""
    pytest.importorskip("transformers")
    from engine.models.synthetic_tokenizer import save_tokenizer
    from tests.models.test_llama4_model import CHUNK, write_llama4

    checkpoint = write_llama4(tmp_path / "llama4")
    save_tokenizer(checkpoint, 512, 256)
    handed_back = counted_hand_backs(monkeypatch)
    workload = load_workload({**WORKLOAD, "name": "tiny-llama4",
                              "engine": {**WORKLOAD["engine"], "block_size": 8, "num_gpu_blocks": 128,
                                         "max_model_len": 256}})
    real = build_real_engine(workload, model=str(checkpoint), threads=1)
    manager = real.engine.scheduler.kv_cache_manager
    assert [group.attention_chunk for group in manager.groups] == [None, CHUNK, CHUNK, CHUNK]
    out = tmp_path / "real"
    result = run_real(workload, out, real.engine, vocab_size=real.vocab_size,
                      reserved_token_ids=real.reserved_token_ids, executor_info=real.info)
    assert result.summary["num_finished"] == 16 and sum(handed_back) > 0
    assert manager.num_free_blocks == manager.num_usable_blocks
    cache = read_run(out).summary["config"]["cache"]
    assert cache["kv_cache_groups"] == [None, CHUNK, CHUNK, CHUNK] and cache["attention_chunk_size"] == CHUNK
    assert_replays_exactly(out)
