"""Chunked local attention (Llama 4) in the step features: a query in a chunked layer reads its own chunk's keys,
p % chunk + 1 of them; the step's attention terms are those of its per-chunk virtual requests (as the engine attends
them), blended over the layers with the unchunked ones."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cost_models import AnalyticalCostModel, StepBatch
from sim.cost_models.step_batch import step_features
from sim.hardware import resolve_hardware
from sim.model_presets import resolve_model

CHUNK = 16


def _keys_read(batch: StepBatch, chunk: int | None) -> int:
    """Every query's keys, by definition: position p reads p % chunk + 1 (all p + 1 without chunks)."""
    return sum((p % chunk if chunk else p) + 1 for q, ctx in zip(batch.num_scheduled_tokens, batch.num_computed_tokens)
               for p in range(ctx, ctx + q))


def _attention_keys(features) -> int:
    return features.decode_context_tokens + features.prefill_attention_work


@settings(max_examples=200, deadline=None)
@given(requests=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 70)), min_size=1, max_size=6))
def test_every_query_reads_its_chunks_keys(requests):
    batch = StepBatch([q for q, _ in requests], [ctx for _, ctx in requests], attention_chunk_size=CHUNK)
    features = step_features(batch)
    assert _attention_keys(features) == _keys_read(batch, CHUNK)
    plain = step_features(dataclasses.replace(batch, attention_chunk_size=None))
    assert _attention_keys(plain) == _keys_read(batch, None)
    # Counts stay the plain ones; only attention terms shrink.
    assert (features.num_tokens, features.num_reqs, features.max_seq_len) == (plain.num_tokens, plain.num_reqs,
                                                                               plain.max_seq_len)


def test_a_share_of_chunked_layers_blends_the_terms():
    batch = StepBatch([1, 30], [100, 5], attention_chunk_size=CHUNK, attention_chunk_fraction=0.75)
    chunked = step_features(dataclasses.replace(batch, attention_chunk_fraction=1.0))
    plain = step_features(dataclasses.replace(batch, attention_chunk_size=None))
    blended = step_features(batch)
    assert blended.decode_context_tokens == round(0.75 * chunked.decode_context_tokens
                                                  + 0.25 * plain.decode_context_tokens)
    assert blended.prefill_attention_work == round(0.75 * chunked.prefill_attention_work
                                                   + 0.25 * plain.prefill_attention_work)


def test_llama4_long_context_decodes_cost_a_quarter_of_the_attention():
    """At 100k tokens of context, three layers in four read at most 8,192 keys."""
    scout, h200 = resolve_model("llama-4-scout"), resolve_hardware("h200")
    unchunked = dataclasses.replace(scout, attention_chunk_size=None, num_chunked_layers=None)
    decodes = dict(num_scheduled_tokens=[1] * 16, num_computed_tokens=[100_000 + 37 * i for i in range(16)])
    chunked_batch = StepBatch(**decodes, attention_chunk_size=8192, attention_chunk_fraction=0.75)
    with_chunks = AnalyticalCostModel(scout, h200).breakdown(chunked_batch)["attention_decode"]
    without = AnalyticalCostModel(unchunked, h200).breakdown(StepBatch(**decodes))["attention_decode"]
    assert 0.25 < with_chunks / without < 0.32  # a quarter of the layers read everything, the rest a little


def test_a_scout_simulation_runs_priced_by_chunks():
    from sim.engine_setup import build_setup
    from workloads import example_path, load_workload

    workload = load_workload(example_path("chat"), overrides=[
        "workload.num_requests=20", "model=llama-4-scout", "hardware=h200", "engine.tensor_parallel_size=8"])
    setup = build_setup(workload)
    assert (setup.cache_config.attention_chunk_size, setup.cache_config.attention_chunk_fraction) == (8192, 0.75)


def test_the_engines_llama4_config_reports_its_chunks(tmp_path):
    pytest.importorskip("torch")
    from engine.models.config import ModelConfig
    from tests.models.test_llama4_model import write_llama4

    config = ModelConfig.from_pretrained(write_llama4(tmp_path / "llama4"))
    assert config.attention_chunk == (16, 0.75)
    assert ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 10,
                                  "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
                                  "num_attention_heads": 2}).attention_chunk == (None, 1.0)
