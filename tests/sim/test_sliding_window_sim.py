"""Sliding-window models in the simulator: the windowed step features, the KV the engine hands back, the
presets and config.json reading, and what is refused."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis import read_run

from sim.cost_models.step_batch import (PREFILL_QUERY_SLICE, StepBatch, sliced_prefill_pairs, step_features,
                                        windowed_keys, windowed_sliced_pairs)
from sim.engine_setup import SetupError
from sim.hf_model_config import model_from_hf_config
from sim.model_presets import MODEL_PRESETS
from sim.run_pipeline import run_simulation
from workloads import load_workload


@settings(max_examples=200, deadline=None)
@given(first=st.integers(1, 600), count=st.integers(1, 600), window=st.integers(1, 700))
def test_windowed_keys_is_the_sum_of_capped_lengths(first, count, window):
    assert windowed_keys(first, count, window) == sum(min(k, window) for k in range(first, first + count))


@settings(max_examples=100, deadline=None)
@given(query=st.integers(2, 3 * PREFILL_QUERY_SLICE + 5), context=st.integers(0, 700), window=st.integers(1, 900))
def test_windowed_sliced_pairs_counts_what_each_slice_scores(query, context, window):
    expected = 0
    for start in range(0, query, PREFILL_QUERY_SLICE):
        end = min(query, start + PREFILL_QUERY_SLICE)
        first_key = max(0, context + start - window + 1)  # the slice's first row's window start
        expected += (end - start) * (context + end - first_key)
    assert windowed_sliced_pairs(query, context, window) == expected
    if window >= context + query:
        assert windowed_sliced_pairs(query, context, window) == sliced_prefill_pairs(query, context)


def test_a_window_past_every_sequence_changes_no_feature():
    batch = dict(num_scheduled_tokens=[1, 1, 300, 40, 3], num_computed_tokens=[50, 900, 0, 200, 10],
                 num_spec_tokens=[0, 0, 0, 0, 2])
    assert step_features(StepBatch(**batch, sliding_window=10_000)) == step_features(StepBatch(**batch))


def test_a_window_caps_what_each_query_reads():
    window = 64
    features = step_features(StepBatch([1, 1, 100], [10, 1000, 500], sliding_window=window))
    assert features.decode_context_tokens == 11 + window  # the short decode reads its 11 keys, the long one 64
    assert features.prefill_context_tokens == window - 1  # the chunk's first query reads 63 cached keys
    assert features.prefill_attention_work == 100 * window  # every row of the chunk reads a full window
    assert features.num_tokens == 102 and features.max_seq_len == 1001


def long_context_workload(model, **engine):
    return load_workload({
        "name": "long", "seed": 3, "model": model, "hardware": "h100-sxm", "dtype": "bfloat16",
        "engine": {"num_gpu_blocks": 3000, "max_num_seqs": 64, "max_model_len": 32768, **engine},
        "workload": {"num_requests": 60, "arrival": {"type": "poisson", "rate": 4},
                     "prompt_len": {"type": "uniform", "min": 6000, "max": 14000},
                     "output_len": {"type": "uniform", "min": 200, "max": 600}},
    })


def test_mistral_v01_holds_only_its_window_and_reads_only_its_window(tmp_path):
    """Mistral-7B-v0.1's 4096-token window against the same shape with full attention, on prompts of 6-14k
    tokens in a pool of 3,000 blocks (48k tokens): the window frees most of each request's blocks, so the
    engine preempts a third as often and admits more requests at once; every decode reads at most 4096 keys."""
    assert MODEL_PRESETS["mistral-7b"].sliding_window == 4096
    # Mistral-7B-v0.1's config.json with the window switched off (as v0.2 has it).
    full_config = tmp_path / "mistral-7b-full.json"
    full_config.write_text(json.dumps({
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "num_hidden_layers": 32, "vocab_size": 32000,
        "max_position_embeddings": 32768, "sliding_window": None}))
    full_shape = model_from_hf_config(full_config)
    assert full_shape.num_parameters == MODEL_PRESETS["mistral-7b"].num_parameters
    windowed = run_simulation(long_context_workload("mistral-7b"), tmp_path / "windowed")
    full = run_simulation(long_context_workload(str(full_config)), tmp_path / "full")
    assert windowed.summary["num_finished"] == full.summary["num_finished"] == 60
    assert windowed.summary["num_preemptions"] < full.summary["num_preemptions"] / 2
    assert windowed.summary["kv_usage_max"] < full.summary["kv_usage_max"]
    # More requests fit at once, so they wait less for their first token (measured: TTFT p50 9.5 s against 26.6 s).
    assert windowed.summary["ttft_ms"]["p50"] < 0.5 * full.summary["ttft_ms"]["p50"]

    def mean_decode_read(name):
        steps = read_run(tmp_path / name).steps
        return steps["decode_context_tokens"] / steps["num_decode_reqs"].clip(lower=1)

    assert mean_decode_read("windowed").max() <= 4096 < mean_decode_read("full").max()


def write_config(tmp_path, **config):
    base = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 128, "num_hidden_layers": 4, "vocab_size": 100,
            "max_position_embeddings": 4096}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, **config}))
    return path


def test_config_json_windows_as_transformers_reads_them(tmp_path):
    mistral = dict(architectures=["MistralForCausalLM"], model_type="mistral")
    assert model_from_hf_config(write_config(tmp_path, **mistral)).sliding_window == 4096  # transformers' default
    assert model_from_hf_config(write_config(tmp_path, **mistral, sliding_window=None)).sliding_window is None
    assert model_from_hf_config(write_config(tmp_path, sliding_window=512)).sliding_window is None  # not used
    assert model_from_hf_config(write_config(tmp_path, sliding_window=512, use_sliding_window=True,
                                             max_window_layers=0)).sliding_window == 512
    mixed = model_from_hf_config(write_config(tmp_path, sliding_window=512, use_sliding_window=True, max_window_layers=3))
    assert (mixed.sliding_window, mixed.num_sliding_layers, mixed.sliding_window_fraction) == (512, 1, 0.25)
    gemma = model_from_hf_config(write_config(tmp_path, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
                                              num_hidden_layers=12, sliding_window=512, head_dim=None))
    # Five local layers to one global: layers 5 and 11 are global; head_dim 256 and tied embeddings by default.
    assert (gemma.sliding_window, gemma.num_sliding_layers, gemma.head_dim, gemma.tied_embeddings) == (512, 10, 256, True)
    gemma2 = model_from_hf_config(write_config(tmp_path, architectures=["Gemma2ForCausalLM"], model_type="gemma2",
                                               num_hidden_layers=6, head_dim=None))
    assert (gemma2.sliding_window, gemma2.num_sliding_layers) == (4096, 3)  # local and global layers alternate
    with pytest.raises(ValueError, match="key 'sliding_window' must be a positive integer or null, got 0"):
        model_from_hf_config(write_config(tmp_path, **mistral, sliding_window=0))


def test_kv_offloading_of_a_windowed_model_is_refused_by_name():
    with pytest.raises(SetupError, match="engine.kv_offloading_size_gib: 8 GiB is not supported with model "
                                         "'mistral-7b', whose layers attend a sliding window of 4096"):
        run_simulation(long_context_workload("mistral-7b", kv_offloading_size_gib=8), None)


@pytest.mark.parametrize("preset,billions,sliding,pattern", [
    ("gemma-3-1b", 1.000, 22, 6), ("gemma-3-4b", 3.88, 29, 6), ("gemma-3-12b", 11.77, 40, 6), ("gemma-3-27b", 27.01, 52, 6),
    ("gemma-2-2b", 2.61, 13, 2), ("gemma-2-9b", 9.24, 21, 2), ("gemma-2-27b", 27.23, 23, 2)])
def test_gemma_presets_have_their_published_parameters_and_pattern(preset, billions, sliding, pattern):
    shape = MODEL_PRESETS[preset]
    assert shape.num_parameters / 1e9 == pytest.approx(billions, rel=0.005)
    assert shape.num_sliding_layers == sliding and shape.num_layers - sliding == shape.num_layers // pattern


def test_a_partly_windowed_model_keeps_every_block_and_prices_the_mean_over_layers(tmp_path):
    """Gemma 3 (22 of 26 layers windowed) in one table of every layer (vLLM without its hybrid KV cache, which
    tests/sim/test_hybrid_kv_cache_sim.py covers): no block is handed back (the global layers read them), every
    step's decode reads are the layers' mean of windowed and full reads, the same with and without the
    fast-forward."""
    workload = long_context_workload("gemma-3-1b", disable_hybrid_kv_cache_manager=True)
    result = run_simulation(workload, tmp_path / "gemma")
    assert result.summary["num_finished"] == 60
    steps = read_run(tmp_path / "gemma").steps
    # The same shape with every layer global: the same 6-14k-token requests read their whole context.
    full_config = tmp_path / "gemma-3-1b-global.json"
    full_config.write_text(json.dumps({
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 1152,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "intermediate_size": 6912,
        "num_hidden_layers": 26, "vocab_size": 262144, "max_position_embeddings": 32768, "sliding_window": None,
        "layer_types": ["full_attention"] * 26}))
    run_simulation(long_context_workload(str(full_config)), tmp_path / "global")
    full_steps = read_run(tmp_path / "global").steps

    def read_per_decode(frame):
        return frame["decode_context_tokens"].sum() / frame["num_decode_reqs"].sum()

    # 22 local layers read at most 512 keys, 4 global ones ~10k: the mean over layers is about a fifth.
    ratio = read_per_decode(steps) / read_per_decode(full_steps)
    assert 0.1 < ratio < 0.3
    assert result.summary["num_preemptions"] > 0  # every block stays: the pool fills as with full attention
    again = run_simulation(workload, tmp_path / "gemma-no-ff", fast_forward=False)
    assert read_run(tmp_path / "gemma-no-ff").steps.equals(steps)
    assert again.summary["ttft_ms"] == result.summary["ttft_ms"]


def test_a_windowed_model_in_a_disaggregated_cluster_serves_every_request(tmp_path):
    """Prefill engines hand their KV to decode engines; with Mistral-7B-v0.1's window on prompts past it, the
    decode engines load whole prompts and then hand back what leaves each window."""
    from workloads import example_path

    workload = load_workload(example_path("disaggregation"), overrides=[
        "model=mistral-7b", "sweep={}", "workload.num_requests=60", "engine.max_model_len=32768",
        "workload.prompt_len={type: uniform, min: 6000, max: 12000}", "workload.arrival.rate=2"])
    result = run_simulation(workload, tmp_path / "disaggregated")
    assert result.summary["num_finished"] == 60
