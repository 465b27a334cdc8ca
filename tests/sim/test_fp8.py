"""fp8 in the simulator: a KV cache (engine.kv_cache_dtype) holds twice the blocks and halves the KV bytes
read; weights (engine.quantization) halve the projections' bytes and run at the fp8 rate where there is one."""

from __future__ import annotations

import pytest

from sim.cost_models import AnalyticalCostModel, StepBatch
from sim.engine_setup import SetupError, build_setup
from sim.hardware import resolve_hardware
from sim.model_presets import resolve_model
from sim.kv_cache_capacity import kv_cache_num_blocks
from workloads import WorkloadError, example_path, load_workload


def chat(*overrides):
    return load_workload(example_path("chat"), overrides=["workload.num_requests=50", *overrides])


def test_an_fp8_cache_holds_twice_the_blocks():
    model, hardware = resolve_model("llama-3-8b"), resolve_hardware("h100-sxm")
    auto = kv_cache_num_blocks(model, hardware, "bfloat16", 16, 0.9)
    fp8 = kv_cache_num_blocks(model, hardware, "bfloat16", 16, 0.9, kv_cache_dtype="fp8")
    assert fp8 in (2 * auto, 2 * auto + 1)
    assert build_setup(chat("engine.kv_cache_dtype=fp8")).cache_config.num_gpu_blocks == fp8


def test_an_fp8_cache_halves_what_decode_attention_reads_and_nothing_else():
    model, hardware = resolve_model("llama-3-8b"), resolve_hardware("h100-sxm")
    batch = StepBatch(num_scheduled_tokens=[1] * 32, num_computed_tokens=[2000] * 32)
    auto = AnalyticalCostModel(model, hardware, "bfloat16").breakdown(batch)
    fp8 = AnalyticalCostModel(model, hardware, "bfloat16", kv_cache_dtype="fp8").breakdown(batch)
    # The KV read dominates a long-context decode; q and the output stay 16-bit.
    assert fp8["attention_decode"] == pytest.approx(auto["attention_decode"] / 2, rel=0.01)
    assert fp8["linear_layers"] == auto["linear_layers"]
    assert fp8["elementwise"] < auto["elementwise"]  # the cache write stores one byte an element
    assert AnalyticalCostModel(model, hardware, "bfloat16", kv_cache_dtype="auto").kv_cache_dtype == "bfloat16"


def test_what_cannot_use_an_fp8_cache_is_refused_by_field(capsys):
    from sim.run import main as sim_run_main

    with pytest.raises(WorkloadError, match="engine.kv_cache_dtype"):
        chat("engine.kv_cache_dtype=int4")
    with pytest.raises(SetupError, match="engine.kv_cache_dtype: 'fp8' needs the analytical cost model"):
        build_setup(chat("engine.kv_cache_dtype=fp8"), "sim/data/profiles/cpu-small-float32.json")
    assert sim_run_main(["chat", "--executor", "real", "--set", "engine.kv_cache_dtype=fp8"]) == 2
    assert "engine.kv_cache_dtype: 'fp8' is simulated only" in capsys.readouterr().err


def test_fp8_weights_halve_the_projections_and_leave_the_rest():
    model = resolve_model("llama-3-8b")
    linear = model.linear_parameters
    assert model.weight_bytes("bfloat16", "fp8") == model.weight_bytes("bfloat16") - linear
    hardware = resolve_hardware("h100-sxm")
    assert kv_cache_num_blocks(model, hardware, "bfloat16", 16, 0.9, quantization="fp8") > \
        kv_cache_num_blocks(model, hardware, "bfloat16", 16, 0.9)


@pytest.mark.parametrize("hardware, compute_speedup", [("h100-sxm", 2.0), ("a100-80gb", 1.0)])
def test_fp8_weights_read_half_the_bytes_and_compute_at_the_fp8_rate_where_there_is_one(hardware, compute_speedup):
    model, spec = resolve_model("llama-3-8b"), resolve_hardware(hardware)
    plain = AnalyticalCostModel(model, spec, "bfloat16")
    fp8 = AnalyticalCostModel(model, spec, "bfloat16", quantization="fp8")
    one_decode = StepBatch(num_scheduled_tokens=[1], num_computed_tokens=[100])
    # Weight-bound: half the bytes, on any device (A100: weight-only, widened as read).
    assert fp8.breakdown(one_decode)["linear_layers"] == pytest.approx(plain.breakdown(one_decode)["linear_layers"] / 2,
                                                                       rel=0.02)
    prefill = StepBatch(num_scheduled_tokens=[8192], num_computed_tokens=[0])
    ratio = plain.breakdown(prefill)["linear_layers"] / fp8.breakdown(prefill)["linear_layers"]
    assert ratio == pytest.approx(compute_speedup, rel=0.05)
    assert fp8.breakdown(prefill)["lm_head"] == plain.breakdown(prefill)["lm_head"]  # lm_head stays 16-bit
    assert fp8.describe()["quantization"] == "fp8"


def test_fp8_weights_are_refused_where_they_cannot_be_simulated(capsys):
    from sim.run import main as sim_run_main

    with pytest.raises(SetupError, match="engine.quantization: 'fp8' needs the analytical cost model"):
        build_setup(chat("engine.quantization=fp8"), "sim/data/profiles/cpu-small-float32.json")
    assert sim_run_main(["chat", "--executor", "real", "--set", "engine.quantization=fp8"]) == 2
    assert "engine.quantization: 'fp8' is simulated only" in capsys.readouterr().err
    with pytest.raises(WorkloadError, match="engine.quantization"):
        chat("engine.quantization=awq")
