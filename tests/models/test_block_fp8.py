"""Block-scaled FP8 checkpoints (DeepSeek-V3's and the Qwen3 -FP8 models' layout): dequantized at load into the model
a float32 checkpoint of the same values gives, whatever the order the weight and its scales come in."""

import json
import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.models import load_model, make_test_model
from engine.models.block_fp8 import dequantize_block_fp8, dequantized_weights, parse_block_fp8
from engine.models.config import ModelConfig

FP8 = torch.float8_e4m3fn
BLOCK = (16, 32)
QUANTIZATION = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": list(BLOCK)}


def _quantize(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """A float weight -> (float8 weight, float32 scales per block), each block scaled so its largest entry is 448."""
    rows, columns = weight.shape
    scales = torch.empty(-(-rows // block[0]), -(-columns // block[1]))
    quantized = torch.empty_like(weight, dtype=FP8)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            tile = weight[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]]
            scales[i, j] = tile.abs().max().clamp(min=1e-12) / 448.0
            quantized[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]] = (tile / scales[i, j]).to(FP8)
    return quantized, scales


def test_dequantization_is_each_blocks_scale_times_its_codes():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 70, generator=generator)  # partial blocks on both axes
    quantized, scales = _quantize(weight, BLOCK)
    dequantized = dequantize_block_fp8(quantized, scales, BLOCK, torch.float32)
    assert dequantized[17, 65] == quantized[17, 65].float() * scales[1, 2]
    torch.testing.assert_close(dequantized, weight, atol=0, rtol=0.07)  # E4M3 keeps 3 mantissa bits
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight
    assert torch.equal(dequantized, _dequantize_fp8_weight(quantized, scales, list(BLOCK), torch.float32))
    with pytest.raises(ValueError, match=r"blocks of 16x32 needs scales of shape \(3, 3\), got \(2, 3\)"):
        dequantize_block_fp8(quantized, scales[:2], BLOCK, torch.float32)


def test_a_block_fp8_checkpoint_is_its_dequantized_model(tmp_path):
    source = make_test_model(tmp_path / "source", "qwen2", intermediate_size=96, seed=3)
    config = json.loads((source / "config.json").read_text())
    weights = load_file(source / "model.safetensors")
    quantized, dequantized = {}, {}
    for name, tensor in weights.items():
        if name.endswith("_proj.weight"):  # the linear layers; norms, embedding and head stay as they are
            codes, scales = _quantize(tensor, BLOCK)
            quantized[name], quantized[name.replace(".weight", ".weight_scale_inv")] = codes, scales
            dequantized[name] = dequantize_block_fp8(codes, scales, BLOCK, torch.float32)
        else:
            quantized[name] = dequantized[name] = tensor
    for folder, tensors, extra in ((tmp_path / "fp8", quantized, {"quantization_config": QUANTIZATION}),
                                   (tmp_path / "float32", dequantized, {})):
        folder.mkdir()
        save_file(tensors, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps({**config, **extra}))
    model, model_config = load_model(tmp_path / "fp8", torch.float32)
    reference, _ = load_model(tmp_path / "float32", torch.float32)
    assert model_config.weight_block_fp8 == BLOCK
    for name, tensor in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    from tests.models.test_models_vs_transformers import PagedSession
    tokens = [random.Random(4).randrange(4, 500) for _ in range(20)]
    torch.testing.assert_close(PagedSession(model, model_config).step({"r": tokens})["r"],
                               PagedSession(reference, model_config).step({"r": tokens})["r"], atol=0, rtol=0)


def test_scales_before_their_weight_and_parts_without_a_partner():
    codes, scales = _quantize(torch.randn(16, 32), BLOCK)
    # A sharded checkpoint may list a weight's scales first.
    out = dict(dequantized_weights([("a.weight_scale_inv", scales), ("b.bias", torch.ones(2)), ("a.weight", codes)],
                                   BLOCK, torch.bfloat16))
    assert out["a.weight"].dtype == torch.bfloat16 and set(out) == {"a.weight", "b.bias"}
    with pytest.raises(ValueError, match="checkpoint tensor 'a.weight' is float8 but has no a.weight_scale_inv"):
        list(dequantized_weights([("a.weight", codes)], BLOCK, torch.float32))
    with pytest.raises(ValueError, match="checkpoint has a.weight_scale_inv but no float8 'a.weight'"):
        list(dequantized_weights([("a.weight_scale_inv", scales)], BLOCK, torch.float32))


@pytest.mark.parametrize("quantization, message", [
    ({**QUANTIZATION, "weight_block_size": [128]}, "weight_block_size must be two positive integers, got \\[128\\]"),
    ({**QUANTIZATION, "activation_scheme": "static"}, "activation_scheme 'static' is not supported"),
    ({"quant_method": "fp8"}, "quant_method 'fp8'\\) is not supported"),  # per-tensor FP8: other tensor names
])
def test_other_fp8_checkpoints_are_refused_by_key(quantization, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 10,
                               "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
                               "num_attention_heads": 2, "quantization_config": quantization})
    assert parse_block_fp8({"quant_method": "gptq"}) is None
