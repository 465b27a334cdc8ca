"""How many KV blocks the pool gets, and the zeroing of newly allocated blocks."""

import pytest
import torch

from engine.models.config import ModelConfig
from engine.runner.attention import kv_cache_bytes_per_block
from engine.runner.config import DEFAULT_CPU_KV_CACHE_BYTES, RunnerConfig
from engine.runner.kv_cache_sizing import determine_num_gpu_blocks, estimate_activation_bytes
from engine.runner.model_runner import ModelRunner


@pytest.fixture(scope="module")
def model_config(tiny_llama_path):
    return ModelConfig.from_pretrained(tiny_llama_path)


def blocks(model_config, device="cpu", **kwargs):
    base = dict(block_size=16, dtype=torch.float32, device=torch.device(device), max_num_seqs=4,
                max_model_len=256, max_num_batched_tokens=512)
    return determine_num_gpu_blocks(model_config, **{**base, **kwargs})


def test_budgets(model_config):
    per_block = kv_cache_bytes_per_block(2, 16, 2, 16, torch.float32)
    assert per_block == 2 * 2 * 16 * 2 * 16 * 4
    assert blocks(model_config, num_gpu_blocks=7, kv_cache_memory_bytes=10**9) == 7  # explicit count wins
    assert blocks(model_config, kv_cache_memory_bytes=100 * per_block + 5) == 100
    # The CPU default budget is capped at what max_num_seqs full-length requests could use.
    assert blocks(model_config) == 4 * 256 // 16 + 1
    assert blocks(model_config, max_num_seqs=10**6, max_model_len=2048) == DEFAULT_CPU_KV_CACHE_BYTES // per_block
    with pytest.raises(ValueError, match="at least 2 are needed"):
        blocks(model_config, kv_cache_memory_bytes=per_block)


def test_cuda_budget_from_free_memory(model_config, monkeypatch):
    gib = 1 << 30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (30 * gib, 40 * gib))
    per_block = kv_cache_bytes_per_block(2, 16, 2, 16, torch.float16)
    activations = estimate_activation_bytes(model_config, 512, 4, torch.float16)
    expected = (int(0.9 * 40 * gib) - 10 * gib - activations) // per_block
    assert blocks(model_config, device="cuda", dtype=torch.float16, gpu_memory_utilization=0.9) == expected


def test_new_blocks_are_zeroed(tiny_llama_path):
    runner = ModelRunner(RunnerConfig(model=tiny_llama_path, max_num_seqs=2, num_gpu_blocks=8))
    runner.initialize_kv_cache(runner.determine_num_gpu_blocks(64))
    for key_cache, value_cache in runner.kv_caches:
        key_cache.fill_(1.0)
        value_cache.fill_(float("nan"))
    runner._zero_blocks([2, 5])
    for key_cache, value_cache in runner.kv_caches:
        for cache in (key_cache, value_cache):
            assert cache[[2, 5]].eq(0).all()
            assert not cache[[0, 1, 3, 4, 6, 7]].eq(0).any()
