"""Llama-family variants (Phi-3 / Phi-4, Granite, Cohere2): config parsing (a window on every layer, partial RoPE;
Granite's multipliers) and its errors, and the engine end to end. Logit equality with transformers is in
test_models_vs_transformers.py; LongRoPE in test_long_rope.py."""


import pytest
import torch

from engine.models import load_model, make_test_model
from engine.models.config import ModelConfig
from engine.models.phi3 import Phi3ForCausalLM
from tests.models.engine_generation import assert_engine_generates_as_transformers, prompts

BASE = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "vocab_size": 100, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}


def test_configs_read_the_window_and_partial_rope_as_transformers_does():
    phi4 = ModelConfig.from_dict({**BASE, "sliding_window": None, "rope_theta": 250000.0})
    assert phi4.layer_sliding_windows == (None, None) and phi4.rotary_dim == 16 and phi4.rope_theta == 250000.0
    mini = ModelConfig.from_dict({**BASE, "sliding_window": 2047, "partial_rotary_factor": 0.75})
    assert mini.layer_sliding_windows == (2047, 2047) and mini.rotary_dim == 12
    # transformers 5 writes the factor into rope_parameters.
    assert ModelConfig.from_dict({**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                              "partial_rotary_factor": 0.5}}).rotary_dim == 8


@pytest.mark.parametrize("factor, message", [
    (1.5, "partial_rotary_factor must be in \\(0, 1\\], got 1.5"),
    (0.1875, "turns 3 of head_dim=16 features; RoPE turns pairs"),  # 16 * 0.1875 = 3
])
def test_impossible_partial_rope_is_refused(factor, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict({**BASE, "partial_rotary_factor": factor})
    assert ModelConfig.from_dict({**BASE, "partial_rotary_factor": 0.3}).rotary_dim == 4  # int(4.8), as transformers


def test_the_engine_generates_what_transformers_generates(tmp_path):
    path = make_test_model(tmp_path / "phi3", "phi3", seed=2, config_overrides={"sliding_window": 12,
                                                                                 "partial_rotary_factor": 0.5})
    model, _ = load_model(path, torch.float32)
    assert isinstance(model, Phi3ForCausalLM)
    llm = assert_engine_generates_as_transformers(path, prompts(), max_num_batched_tokens=16, num_gpu_blocks=12,
                                                  max_model_len=64)
    manager = llm.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks


@pytest.mark.parametrize("key", ["embedding_multiplier", "attention_multiplier", "residual_multiplier",
                                 "logits_scaling"])
def test_granite_multipliers_are_checked_by_key(key):
    base = {**BASE, "architectures": ["GraniteForCausalLM"], "model_type": "granite"}
    assert ModelConfig.from_dict(base).model_type == "granite"  # each absent: 1.0, as transformers
    with pytest.raises(ValueError, match=f"config.json: {key} must be a positive number, got -2"):
        ModelConfig.from_dict({**base, key: -2})


def test_cohere2_runs_on_the_hybrid_cache_as_transformers_generates(tmp_path):
    """Command-R7B's layout: three windowed layers with RoPE to a full one without; the engine's hybrid KV cache
    hands the windowed layers' blocks back, and greedy tokens stay transformers'."""
    path = make_test_model(tmp_path / "cohere2", "cohere2", num_hidden_layers=4, seed=4)
    llm = assert_engine_generates_as_transformers(path, prompts(), max_num_batched_tokens=16, num_gpu_blocks=16,
                                                  max_model_len=64)
    assert llm.model_runner.kv_cache_grouping is not None
    manager = llm.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_usable_blocks