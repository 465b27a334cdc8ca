"""Simulated runs of models that mix sliding-window and full layers, with vLLM's hybrid KV cache.

The grouping follows vLLM's rule (sim/kv_cache_groups.py); the pool holds num_layers / group_size times the
blocks; long sequences then fit several times more requests than with one table holding every layer, and
everything finishes with every block free again.
"""

from __future__ import annotations

import pytest

from sim.engine_setup import SetupError, build_setup
from sim.kv_cache_groups import hybrid_kv_cache_groups
from sim.model_presets import resolve_model
from sim.model_shapes import ModelShape
from sim.run_pipeline import run_simulation
from workloads import load_workload_text

LONG_PROMPTS = """
name: hybrid
seed: 2
model: gemma-3-27b
hardware: h100-sxm
dtype: bfloat16
engine: {max_num_seqs: 64, max_model_len: 32768}
workload:
  num_requests: 60
  arrival: {type: poisson, rate: 2}
  prompt_len: {type: uniform, min: 6000, max: 20000}
  output_len: {type: uniform, min: 20, max: 200}
slo: {ttft_ms: 10000}
"""


def long_prompts(*overrides):
    return load_workload_text(LONG_PROMPTS, overrides=list(overrides))


@pytest.mark.parametrize("name,windows,layers_per_block", [
    ("gemma-3-27b", (None,) + (1024,) * 6, 10),  # 10 global, 52 local: six local groups, the last padded
    ("gemma-3-1b", (None,) + (512,) * 6, 4),
    ("gemma-2-9b", (None, 4096), 21),             # alternating: one group of each
    ("olmo-3-7b", (None,) + (4096,) * 3, 8),      # 8 full, 24 windowed: groups of 8
    ("olmo-3-32b", (None,) + (4096,) * 3, 16),
])
def test_layers_group_as_vllm_groups_them(name, windows, layers_per_block):
    groups = hybrid_kv_cache_groups(resolve_model(name))
    assert groups.windows == windows and groups.layers_per_block == layers_per_block


def test_nearly_even_kinds_make_one_group_each():
    # 12 windowed and 13 full layers: within 25%, so groups of 13 (one padded) rather than 12 (two full groups).
    shape = resolve_model("gemma-2-2b")
    model = ModelShape(**{**{name: getattr(shape, name) for name in ModelShape.__dataclass_fields__},
                          "num_layers": 25, "num_sliding_layers": 12})
    groups = hybrid_kv_cache_groups(model)
    assert groups.windows == (None, 4096) and groups.layers_per_block == 13


def test_models_without_both_kinds_keep_one_table():
    assert hybrid_kv_cache_groups(resolve_model("mistral-7b")) is None  # every layer windowed
    assert hybrid_kv_cache_groups(resolve_model("llama-3-8b")) is None


def test_the_pool_holds_a_block_per_group_of_layers():
    hybrid = build_setup(long_prompts(), requests=[])
    single = build_setup(long_prompts("engine.disable_hybrid_kv_cache_manager=true"), requests=[])
    assert hybrid.cache_config.kv_cache_groups == (None,) + (1024,) * 6
    assert single.cache_config.kv_cache_groups is None
    # A block of 10 layers against one of 62: 6.2 times the blocks (floors aside).
    assert hybrid.cache_config.num_gpu_blocks == pytest.approx(6.2 * single.cache_config.num_gpu_blocks, rel=1e-3)


def test_long_prompts_fit_more_requests_and_all_finish(tmp_path):
    hybrid = run_simulation(long_prompts(), tmp_path / "hybrid").summary
    single = run_simulation(long_prompts("engine.disable_hybrid_kv_cache_manager=true"), tmp_path / "single").summary
    for summary in (hybrid, single):
        assert summary["num_finished"] == summary["num_requests"] == 60
    # Each request holds its whole context in the full group only: more run at once, fewer are preempted.
    assert hybrid["num_preemptions"] < single["num_preemptions"]
    assert hybrid["output_token_throughput"] > 1.5 * single["output_token_throughput"]
    assert hybrid["ttft_ms"]["p90"] < single["ttft_ms"]["p90"]


def test_kv_offloading_turns_the_hybrid_cache_off_as_vllms_connectors_do():
    setup = build_setup(long_prompts("engine.kv_offloading_size_gib=4"), requests=[])
    assert setup.cache_config.kv_cache_groups is None and setup.cache_config.num_offload_blocks > 0


@pytest.mark.parametrize("override,field", [
    ("engine.pipeline_parallel_size=2", "engine.pipeline_parallel_size"),
    ("engine.speculative_decoding={num_speculative_tokens: 2, acceptance_rate: 0.7, method: draft_model, "
     "draft_model: gemma-3-4b}", "engine.speculative_decoding.draft_model"),
])
def test_unsimulated_combinations_are_named(override, field):
    with pytest.raises(SetupError, match=field) as error:
        build_setup(long_prompts(override), requests=[])
    assert "disable_hybrid_kv_cache_manager" in str(error.value)
    build_setup(long_prompts(override, "engine.disable_hybrid_kv_cache_manager=true"), requests=[])


LLAMA4_LONG_CONTEXT = """
name: scout-long-context
seed: 3
model: llama-4-scout
hardware: h100-sxm
dtype: bfloat16
engine: {max_num_seqs: 64, max_model_len: 262144, tensor_parallel_size: 4}
workload:
  num_requests: 24
  arrival: {type: poisson, rate: 1}
  prompt_len: {type: uniform, min: 60000, max: 120000}
  output_len: {type: uniform, min: 20, max: 100}
"""


@pytest.mark.parametrize("name", ["llama-4-scout", "llama-4-maverick"])
def test_llama4_chunked_layers_group_by_their_chunk(name):
    # 12 full (NoPE) layers and 36 chunked ones of 48: groups of 12, one full and three chunked, as vLLM's.
    groups = hybrid_kv_cache_groups(resolve_model(name))
    assert groups.windows == (None, 8192, 8192, 8192) and groups.layers_per_block == 12


def test_llama4_long_contexts_hold_a_chunk_in_chunked_layers_and_fit_more_requests(tmp_path):
    workload = load_workload_text(LLAMA4_LONG_CONTEXT)
    single_workload = load_workload_text(LLAMA4_LONG_CONTEXT, overrides=["engine.disable_hybrid_kv_cache_manager=true"])
    setup = build_setup(workload, requests=[])
    assert setup.cache_config.kv_cache_groups == (None, 8192, 8192, 8192)
    assert setup.cache_config.attention_chunk_size == 8192
    # A block of 12 layers against one of 48: four times the blocks.
    single_blocks = build_setup(single_workload, requests=[]).cache_config.num_gpu_blocks
    assert setup.cache_config.num_gpu_blocks == pytest.approx(4 * single_blocks, rel=1e-3)
    hybrid = run_simulation(workload, tmp_path / "hybrid").summary
    single = run_simulation(single_workload, tmp_path / "single").summary
    for summary in (hybrid, single):
        assert summary["num_finished"] == summary["num_requests"] == 24
    # A 100k-token context holds all its blocks in the full group and about a chunk's in each chunked group: close
    # to four times the requests fit at once, which shows in fewer preemptions and shorter queues.
    assert hybrid["num_preemptions"] < single["num_preemptions"]
    assert hybrid["ttft_ms"]["p90"] < single["ttft_ms"]["p90"]
