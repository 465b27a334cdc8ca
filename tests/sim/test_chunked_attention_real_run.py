"""A real run of a Llama 4 checkpoint (CPU) and its replay: on vLLM's hybrid KV cache the chunked layers' groups hand
back the blocks before each request's current chunk while it runs, and the simulator, driving the same core with the
recorded cache config (its groups and chunk), takes exactly the same decisions."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from analysis import read_run, requests_table, steps_table  # noqa: E402
from engine.core.kv_cache_manager import KVCacheManager  # noqa: E402
from engine.models.synthetic_tokenizer import save_tokenizer  # noqa: E402
from sim.real_engine import build_real_engine  # noqa: E402
from sim.real_run import run_real  # noqa: E402
from sim.replay import compare_replay, replay  # noqa: E402
from tests.models.test_llama4_model import CHUNK, write_llama4  # noqa: E402
from workloads import load_workload  # noqa: E402

WORKLOAD = {
    "name": "tiny-llama4", "seed": 5, "model": "tiny", "hardware": "cpu", "dtype": "float32",
    "engine": {"block_size": 8, "num_gpu_blocks": 128, "max_num_seqs": 8, "max_num_batched_tokens": 64,
               "max_model_len": 256, "enable_prefix_caching": True},
    "workload": {"num_requests": 16, "arrival": {"type": "poisson", "rate": 100},
                 "prompt_len": {"type": "uniform", "min": 20, "max": 160},
                 "output_len": {"type": "uniform", "min": 10, "max": 40},
                 "shared_prefix": {"num_groups": 2, "prefix_len": 48, "fraction": 0.5}},
}


def test_a_llama4_real_run_hands_back_chunked_blocks_and_replays_exactly(tmp_path, monkeypatch):
    checkpoint = write_llama4(tmp_path / "llama4")
    save_tokenizer(checkpoint, 512, 256)
    handed_back = []
    free_out_of_window = KVCacheManager.free_blocks_out_of_window

    def counting(manager, request):
        before = manager.num_skipped_block[request.request_id]
        free_out_of_window(manager, request)
        handed_back.append(manager.num_skipped_block[request.request_id] - before)

    monkeypatch.setattr(KVCacheManager, "free_blocks_out_of_window", counting)
    workload = load_workload(WORKLOAD)
    real = build_real_engine(workload, model=str(checkpoint), threads=1)
    manager = real.engine.scheduler.kv_cache_manager
    assert manager.group_windows == (None, CHUNK, CHUNK, CHUNK)
    assert [group.attention_chunk for group in manager.groups] == [None, CHUNK, CHUNK, CHUNK]
    out = tmp_path / "real"
    result = run_real(workload, out, real.engine, vocab_size=real.vocab_size,
                      reserved_token_ids=real.reserved_token_ids, executor_info=real.info)
    assert result.summary["num_finished"] == 16 and sum(handed_back) > 0
    assert manager.num_free_blocks == manager.num_usable_blocks
    run = read_run(out)
    cache = run.summary["config"]["cache"]
    assert cache["kv_cache_groups"] == [None, CHUNK, CHUNK, CHUNK] and cache["attention_chunk_size"] == CHUNK
    recorder, run, cost_model = replay(out)
    report = compare_replay(run, requests_table(recorder.request_columns()).to_pandas(),
                            steps_table(recorder.step_columns()).to_pandas())
    assert cost_model.finished
    assert report.identical, report.describe()
