"""An fp8 KV cache in the simulator (engine.kv_cache_dtype): twice the blocks, half the KV bytes read."""

from __future__ import annotations

import pytest

from sim.cost_models import AnalyticalCostModel, StepBatch
from sim.engine_setup import SetupError, build_setup
from sim.hardware import resolve_hardware
from sim.model_shapes import kv_cache_num_blocks, resolve_model
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
