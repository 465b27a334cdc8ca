"""Sliding-window models against transformers: every logits row within 1e-4 (fp32), greedy tokens equal.

A Mistral whose every layer attends a 12-token window, and a Qwen2 whose first layer attends the full context
and second a window (``use_sliding_window`` from ``max_window_layers`` on), both run far past the window
through the real scheduler: chunked prefill, prefix caching, and a pool small enough to preempt.
"""

import json

import pytest

from engine.models import make_test_model
from tests.engine.model_fixtures import load_hf_model, mixed_prompts
from tests.runner.test_model_runner_vs_transformers import RecordingExecutor, make_engine, run_and_check

WINDOW = 12


def sliding_checkpoint(path, architecture):
    make_test_model(path, architecture)
    config_path = path / "config.json"
    config = json.loads(config_path.read_text())
    config["sliding_window"] = WINDOW
    if architecture == "qwen2":
        config.update(use_sliding_window=True, max_window_layers=1)  # layer 0 full, layer 1 windowed
    config_path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module", params=["mistral", "qwen2"])
def checkpoint(request, tmp_path_factory):
    path = sliding_checkpoint(tmp_path_factory.mktemp(request.param), request.param)
    return path, load_hf_model(path)


@pytest.mark.parametrize("hybrid", [False, True], ids=["one-table", "hybrid"])
@pytest.mark.parametrize("num_gpu_blocks,budget", [(200, 48), (12, 32)], ids=["roomy", "preempting"])
def test_every_logits_row_matches_transformers(checkpoint, num_gpu_blocks, budget, hybrid):
    """Mistral windowed on every layer (its blocks handed back; no hybrid cache: one kind of layer), and Qwen2
    with one full and one windowed layer (one table of every block, or the hybrid cache's two groups)."""
    path, hf_model = checkpoint
    core, runner = make_engine(path, num_gpu_blocks, max_num_batched_tokens=budget, hybrid=hybrid)
    if hybrid and core.scheduler.cache_config.kv_cache_groups is None:
        pytest.skip("every layer windowed: one kind of layer, no hybrid cache")
    assert {layer.self_attn.sliding_window for layer in runner.model.model.layers} >= {WINDOW}
    core.executor = RecordingExecutor(core.executor)
    prompts = mixed_prompts(runner.vocab_size, seed=7, num_prompts=8)
    assert max(len(prompt) for prompt in prompts) > 4 * WINDOW
    run_and_check(core, runner, hf_model, prompts, max_tokens=20)
    if num_gpu_blocks == 12:
        assert core.scheduler.num_preemptions_total > 0
    manager = core.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks
