"""A checkpoint's config.json says how its weights are stored (quantization_config); the simulator prices them so
when engine.quantization is null, as vLLM runs them, and refuses a scheme it cannot price rather than pricing it as
16-bit weights."""

import json

import pytest

from sim.engine_setup import build_setup
from sim.hf_model_config import model_from_hf_config
from workloads import example_path, load_workload

LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192}
W4A16 = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
    "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                       "group_size": 128}}}, "ignore": ["lm_head"]}


def _config(tmp_path, quantization):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_8B, "quantization_config": quantization}))
    return path


@pytest.mark.parametrize("quantization, scheme", [
    (None, None),
    (W4A16, "w4a16"),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "w8a16"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, "w4a16"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "fp8"),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
        "input_activations": {"num_bits": 8, "type": "float", "dynamic": True}}}}, "fp8"),
])
def test_the_stored_scheme_is_read(tmp_path, quantization, scheme):
    assert model_from_hf_config(_config(tmp_path, quantization)).stored_quantization == scheme


@pytest.mark.parametrize("quantization, method", [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes"),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group"}}}},
     "compressed-tensors"),  # NVFP4
    ({"quant_method": "gptq", "bits": 3}, "gptq"),
])
def test_a_scheme_the_simulator_cannot_price_is_refused_by_name(tmp_path, quantization, method):
    with pytest.raises(ValueError, match=f"quantization_config \\(quant_method '{method}'\\) stores weights in a way "
                                         "the simulator does not price"):
        model_from_hf_config(_config(tmp_path, quantization))


def _workload(config_path, *overrides):
    return load_workload(example_path("chat"), overrides=["workload.num_requests=20", f"model={config_path}",
                                                          *overrides])


def test_a_simulation_prices_the_stored_scheme_unless_told_otherwise(tmp_path):
    path = _config(tmp_path, W4A16)
    stored = build_setup(_workload(path))
    assert stored.cost_model.describe()["quantization"] == "w4a16"
    (tmp_path / "plain").mkdir()
    plain = build_setup(_workload(_config(tmp_path / "plain", None)))
    assert plain.cost_model.describe()["quantization"] is None
    # A quarter of the projections' bytes: room for more KV blocks on the same GPU.
    assert stored.cache_config.num_gpu_blocks > plain.cache_config.num_gpu_blocks
    assert build_setup(_workload(path, "engine.quantization=fp8")).cost_model.describe()["quantization"] == "fp8"


def test_a_real_llm_compressor_checkpoint_is_read_as_stored(tmp_path):
    """The simulator reads a checkpoint the real engine loads (written by the compressed-tensors library)."""
    pytest.importorskip("compressed_tensors")
    from engine.models import make_test_model
    from tests.models.compressed_checkpoints import write_compressed_checkpoint

    source = make_test_model(tmp_path / "source", "llama", seed=3, hidden_size=128, intermediate_size=256)
    path = write_compressed_checkpoint(tmp_path / "w4a16", source, dict(num_bits=4, type="int", symmetric=False,
                                                                         strategy="group", group_size=32))
    shape = model_from_hf_config(path / "config.json")
    assert shape.stored_quantization == "w4a16"
    assert shape.num_parameters == model_from_hf_config(source / "config.json").num_parameters
