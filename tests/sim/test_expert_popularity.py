"""A router that favours some experts (engine.expert_popularity) and vLLM's expert-parallel load balancer
(engine.enable_eplb): fewer distinct experts' weights read, and, across expert-parallel GPUs, a busiest GPU that sets
the pace unless EPLB balances them (sim/expert_popularity.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from sim.cost_models import AnalyticalCostModel
from sim.cost_models.routed_experts import expected_distinct_experts
from sim.engine_setup import SetupError, build_setup
from sim.expert_popularity import ExpertPopularity
from sim.hardware import resolve_hardware
from sim.model_presets import resolve_model
from sim.run import main as sim_run_main
from workloads import example_path, load_workload


def test_inclusion_probabilities_sum_to_k_and_never_pass_one():
    uniform = ExpertPopularity.from_weights(np.ones(256), 8)
    assert np.allclose(uniform.inclusion, 8 / 256)
    for tokens in (1, 7, 100, 4096):
        assert uniform.distinct_experts(tokens) == pytest.approx(expected_distinct_experts(tokens, 256, 8), rel=1e-12)
    skewed = ExpertPopularity.zipf(1.2, 256, 8, seed=0)
    assert skewed.inclusion.sum() == pytest.approx(8.0) and skewed.inclusion.max() == pytest.approx(1.0)
    assert (skewed.inclusion <= 1.0).all() and (skewed.inclusion > 0).all()
    # One expert alone would take more than a token's whole choice: capped at 1, the rest shared in proportion.
    capped = ExpertPopularity.from_weights(np.array([100.0, 1.0, 1.0, 2.0]), 2)
    assert capped.inclusion.tolist() == pytest.approx([1.0, 0.25, 0.25, 0.5])
    # The same seed, the same hot experts.
    assert np.array_equal(ExpertPopularity.zipf(1.2, 256, 8, seed=0).inclusion, skewed.inclusion)
    assert not np.array_equal(ExpertPopularity.zipf(1.2, 256, 8, seed=1).inclusion, skewed.inclusion)


def test_a_skewed_router_touches_fewer_experts_and_loads_one_gpu_more():
    skewed = ExpertPopularity.zipf(1.2, 256, 8, seed=0)
    for tokens in (4, 32, 256):
        assert skewed.distinct_experts(tokens) < expected_distinct_experts(tokens, 256, 8)
    assert skewed.distinct_experts(1) == pytest.approx(8.0)
    share, distinct = skewed.busiest_gpu(8, 4096)
    assert share > 1 / 8 and distinct == pytest.approx(32.0, abs=1e-3)  # past a few thousand tokens: all its 32
    uniform = ExpertPopularity.from_weights(np.ones(256), 8)
    assert uniform.busiest_gpu(8, 100)[0] == pytest.approx(1 / 8)


def test_decodes_cost_less_and_eplb_takes_the_busiest_gpu_back_to_the_mean():
    model, h200 = resolve_model("deepseek-v3"), resolve_hardware("h200")
    skewed = ExpertPopularity.zipf(1.2, 256, 8, seed=0)
    rank = AnalyticalCostModel(model, h200, "bfloat16", quantization="fp8", data_parallel_size=8)
    uniform_moe = rank.expert_parallel
    rank.price_expert_popularity(skewed, eplb=False)
    unbalanced = rank.expert_parallel
    balanced = unbalanced.with_popularity(skewed, balanced=True)
    # EPLB: the mean share of the fewer distinct experts.
    assert balanced.experts_time(256) == pytest.approx(replace(uniform_moe.experts, popularity=skewed).time(256))
    assert balanced.experts_time(256) < uniform_moe.experts_time(256)
    # Without it, a prefill's rows pile onto the GPU with the hottest experts.
    assert unbalanced.experts_time(8192) > 1.5 * balanced.experts_time(8192)
    # A uniform "popularity" changes nothing.
    flat = uniform_moe.with_popularity(ExpertPopularity.from_weights(np.ones(256), 8), balanced=False)
    for tokens in (1, 64, 8192):
        assert flat.experts_time(tokens) == pytest.approx(uniform_moe.experts_time(tokens), rel=1e-9)
    # Tensor parallelism alone: every GPU a slice of every expert, so only the distinct experts change.
    tensor_parallel = AnalyticalCostModel(model, h200, "bfloat16", quantization="fp8", tensor_parallel_size=8)
    before = tensor_parallel.routed_experts.time(32)
    tensor_parallel.price_expert_popularity(skewed, eplb=False)
    assert tensor_parallel.routed_experts.time(32) < before


def example(*overrides):
    return load_workload(example_path("deepseek_data_parallel"), overrides=["sweep=null", *overrides])


@pytest.mark.parametrize("overrides, field, message", [
    (["model=llama-3-70b", "engine.max_model_len=8192", "engine.expert_popularity={zipf: 1.0}"],
     "engine.expert_popularity",
     "'llama-3-70b' is not a mixture of experts"),
    (["engine.enable_eplb=true"], "engine.enable_eplb", "simulated with data-parallel ranks"),
    (["model=mixtral-8x7b", "engine.tensor_parallel_size=1", "engine.data_parallel_size=3", "engine.quantization=null",
      "engine.max_model_len=8192", "engine.expert_popularity={zipf: 1.0}"], "engine.expert_popularity",
     "the 8 experts of 'mixtral-8x7b' do not split evenly over 3 GPUs"),
])
def test_what_does_not_apply_is_refused_by_field(overrides, field, message):
    with pytest.raises(SetupError, match=f"^{field}") as error:
        build_setup(example(*overrides))
    assert message in str(error.value)


def test_eplb_shortens_a_skewed_data_parallel_run(tmp_path):
    e2e = {}
    for eplb in ("false", "true"):
        out = tmp_path / eplb
        arguments = ["deepseek", "--set", "sweep=null", "--set", "engine.tensor_parallel_size=1", "--set",
                     "engine.data_parallel_size=8", "--set", "workload.num_requests=60", "--set",
                     "workload.arrival.rate=1", "--set", "engine.expert_popularity={zipf: 1.2}", "--set",
                     f"engine.enable_eplb={eplb}"]
        assert sim_run_main([*arguments, "--out", str(out), "--no-progress", "--no-dashboard", "--quiet"]) == 0
        e2e[eplb] = json.loads((out / "summary.json").read_text())["e2e_ms"]["p50"]
    assert e2e["true"] < 0.95 * e2e["false"]
