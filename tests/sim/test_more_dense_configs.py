"""The simulator reads Phi-3/Phi-4, Granite, OLMo 2, OLMo 3, GLM-4, GLM-4-0414, Seed-OSS, EXAONE 4, ERNIE 4.5, Hunyuan, InternLM3, Cohere, Cohere2, SmolLM3 and StarCoder2 config.json files as the dense shapes they are: the parameter
count it prices is the real engine's model's, within the few norm weights the shape leaves out, and Phi-3's window
applies to every layer as the engine applies it."""

import pytest
import torch

from engine.models import load_model, make_test_model
from sim.hf_model_config import model_from_hf_config


@pytest.mark.parametrize("architecture, overrides", [("phi3", {"sliding_window": 12}), ("granite", {}),
                                                      ("olmo2", {}), ("olmo3", {}), ("glm", {}), ("glm4", {}), ("seed_oss", {}), ("exaone4", {}), ("ernie4_5", {}), ("hunyuan_v1_dense", {}), ("internlm3", {}), ("cohere", {"use_qk_norm": True}),
                                                      ("cohere2", {}), ("smollm3", {"use_sliding_window": True,
                                                                                    "sliding_window": 8}),
                                                      ("starcoder2", {"sliding_window": 12})])
def test_the_simulator_prices_the_engines_model(tmp_path, architecture, overrides):
    path = make_test_model(tmp_path / architecture, architecture, seed=0, num_hidden_layers=4,
                           config_overrides=overrides)
    shape = model_from_hf_config(path / "config.json")
    model, config = load_model(path, torch.float32)
    engine_parameters = sum(parameter.numel() for parameter in model.parameters())
    # Norm weights (a few per layer: OLMo 2's whole-projection q/k norms) are outside the priced matmuls.
    assert shape.num_parameters == pytest.approx(engine_parameters, rel=0.01)
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim) == (config.num_hidden_layers,
                                                                      config.num_key_value_heads, config.head_dim)
    if architecture in ("phi3", "starcoder2"):
        assert shape.sliding_window == 12 and shape.num_sliding_layers is None  # every layer
    assert shape.gated_mlp == (architecture != "starcoder2")  # StarCoder2's MLP is plain
    windowed = sum(window is not None for window in config.layer_sliding_windows)
    if architecture in ("cohere2", "smollm3", "olmo3", "exaone4"):  # as many windowed layers as the engine's model has
        assert shape.sliding_window == config.sliding_window and shape.num_sliding_layers == windowed
