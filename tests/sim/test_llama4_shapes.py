"""Llama 4 in the simulator: the presets' parameter counts, and config.json files (Llama4ForCausalLM, and the
published Llama4ForConditionalGeneration layout) read as the shapes the engine's model has."""

import json

import pytest

from sim.hf_model_config import model_from_hf_config
from sim.model_presets import resolve_model

SCOUT_TEXT = {"model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
              "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
              "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 202048, "max_position_embeddings": 10485760,
              "num_local_experts": 16, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1,
              "attention_chunk_size": 8192}


@pytest.mark.parametrize("name, total, active", [("llama-4-scout", 107.77, 17.17), ("llama-4-maverick", 400.71, 17.18)])
def test_presets_have_their_counts(name, total, active):
    model = resolve_model(name)
    assert model.num_parameters / 1e9 == pytest.approx(total, rel=1e-3)
    assert model.active_parameters / 1e9 == pytest.approx(active, rel=1e-3)


@pytest.mark.parametrize("preset, overrides", [("llama-4-scout", {}),
                                               ("llama-4-maverick", {"num_local_experts": 128,
                                                                     "interleave_moe_layer_step": 2,
                                                                     "max_position_embeddings": 1048576})])
def test_the_published_layout_reads_as_its_preset(tmp_path, preset, overrides):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4",
                                "text_config": {**SCOUT_TEXT, **overrides}, "vision_config": {"hidden_size": 1408}}))
    shape = model_from_hf_config(path)
    expected = resolve_model(preset)
    assert (shape.num_parameters, shape.active_parameters, shape.num_dense_layers) == \
        (expected.num_parameters, expected.active_parameters, expected.num_dense_layers)


def test_the_simulator_prices_the_engines_model(tmp_path):
    pytest.importorskip("torch")
    import torch

    from engine.models import load_model
    from tests.models.test_llama4_model import write_llama4

    path = write_llama4(tmp_path / "llama4")
    model, _ = load_model(path, torch.float32)
    shape = model_from_hf_config(path / "config.json")
    assert shape.num_parameters == pytest.approx(sum(p.numel() for p in model.parameters()), rel=0.01)
    assert shape.num_dense_layers == 2 and shape.num_experts == 4 and not shape.shared_expert_gate
