"""engine.quantization w4a16 / w8a16 (GPTQ, AWQ, llm-compressor's weight-only integers): the projections' bytes
shrink to 4.125 or 8 bits a weight and their products stay at the 16-bit rate."""

import pytest

from sim.cost_models.analytical import AnalyticalCostModel
from sim.hardware import resolve_hardware
from sim.kv_cache_capacity import kv_cache_num_blocks
from sim.model_presets import resolve_model
from sim.scheduled_batch import StepBatch


@pytest.mark.parametrize("scheme, bytes_per_weight", [("w4a16", 0.515625), ("w8a16", 1.0)])
def test_weights_take_their_bytes_and_the_rest_stays(scheme, bytes_per_weight):
    model = resolve_model("llama-3-70b")
    linear = model.linear_parameters
    assert model.weight_bytes("bfloat16", scheme) == pytest.approx(
        model.weight_bytes("bfloat16") - linear * (2 - bytes_per_weight))
    hardware = resolve_hardware("h100-sxm")
    with pytest.raises(ValueError, match="weights take 131.* GiB in bfloat16"):  # 70B in bf16 does not fit an H100
        kv_cache_num_blocks(model, hardware, "bfloat16", 16, 0.9)
    assert kv_cache_num_blocks(model, hardware, "bfloat16", 16, 0.9, quantization=scheme) > 0


@pytest.mark.parametrize("scheme, weight_read_ratio", [("w4a16", 0.515625 / 2), ("w8a16", 0.5)])
def test_decode_reads_fewer_bytes_and_prefill_computes_at_the_16_bit_rate(scheme, weight_read_ratio):
    model, hardware = resolve_model("llama-3-8b"), resolve_hardware("h100-sxm")
    plain = AnalyticalCostModel(model, hardware, "bfloat16")
    quantized = AnalyticalCostModel(model, hardware, "bfloat16", quantization=scheme)
    one_decode = StepBatch(num_scheduled_tokens=[1], num_computed_tokens=[100])
    assert quantized.breakdown(one_decode)["linear_layers"] == pytest.approx(
        plain.breakdown(one_decode)["linear_layers"] * weight_read_ratio, rel=0.03)
    prefill = StepBatch(num_scheduled_tokens=[8192], num_computed_tokens=[0])
    assert quantized.breakdown(prefill)["linear_layers"] == pytest.approx(plain.breakdown(prefill)["linear_layers"],
                                                                          rel=0.01)
    assert quantized.describe()["quantization"] == scheme
