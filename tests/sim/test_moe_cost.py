"""Mixture-of-experts models in the analytical cost model: the routed experts as a grouped GEMM whose weight
reads follow the expected number of distinct experts a step touches, and dense models exactly as before."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cost_models import AnalyticalCostModel, StepBatch, load_cost_model
from sim.cost_models.routed_experts import expected_distinct_experts
from sim.cost_models.step_batch import step_features
from sim.hardware import resolve_hardware
from sim.model_presets import resolve_model
from sim.model_shapes import dtype_bytes
from sim.profile_match import SHIPPED_PROFILES_DIR

MOE_PRESETS = ("mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen1.5-moe-a2.7b")


def analytical(model: str, hardware: str = "h100-sxm", **options) -> AnalyticalCostModel:
    return AnalyticalCostModel(resolve_model(model), resolve_hardware(hardware), "bfloat16", **options)


def decode_batch(num_requests: int, context: int = 1000) -> StepBatch:
    return StepBatch([1] * num_requests, [context] * num_requests)


# --- dense models are priced exactly as before ----------------------------------------------------------

BATCHES = {
    "decode_1": StepBatch([1], [1000]),
    "decode_64": StepBatch([1] * 64, [500 + 10 * i for i in range(64)]),
    "mixed": StepBatch([1] * 30 + [512, 37], list(range(100, 130)) + [0, 2000]),
    "prefill_4096": StepBatch([4096], [0]),
}
# (model, hardware, options, batch) -> step_time and breakdown, computed by the cost model before it knew
# mixtures of experts (commit 5bdc8b2).
DENSE_BEFORE_MOE = [
    (("llama-3-8b", "h100-sxm", {}, "decode_1"), 0.008204499182487562,
     (0.0055574527999999995, 2.5171040796019902e-06, 5.2428799999999995e-05, 0.0,
      0.0004182837237810945, 8.167546268656716e-07, 0.002173, 0.0)),
    (("llama-3-8b", "h100-sxm", {}, "decode_64"), 0.011218259157014923,
     (0.005669196570746268, 0.00016109466109452737, 0.0027377745512437808, 0.0,
      0.0004249210778109453, 5.227229611940298e-05, 0.002173, 0.0)),
    (("llama-3-8b", "h100-sxm", {}, "mixed"), 0.01652414351477785,
     (0.0120114952727878, 0.0014574032620895522, 0.00018702213731343283, 0.0002475369711442786,
      0.00042154972338308457, 2.613614805970149e-05, 0.002173, 0.0)),
    (("llama-3-8b", "h100-sxm", {}, "prefill_4096"), 0.10775422926027267,
     (0.08497251232701007, 0.010310058310049752, 0.0, 0.009879558144804896,
      0.0004182837237810945, 8.167546268656716e-07, 0.002173, 0.0)),
    (("llama-2-70b", "h100-pcie", {"tensor_parallel_size": 4}, "decode_1"), 0.030986739733333338,
     (0.022823294293333334, 1.1676330666666667e-05, 5.5104853333333336e-05, 0.0,
      8.740292266666666e-05, 3.413333333333333e-07, 0.003901, 0.00410792)),
    (("llama-2-70b", "h100-pcie", {"tensor_parallel_size": 4}, "decode_64"), 0.040189830186666664,
     (0.023218967893333334, 0.0007472851626666667, 0.0028800887466666667, 0.0,
      8.876305066666667e-05, 2.1845333333333332e-05, 0.003901, 0.009331880000000002)),
    (("llama-2-70b", "h100-pcie", {"tensor_parallel_size": 4}, "prefill_4096"), 0.6800544603221268,
     (0.2725161007376074, 0.04782625041066667, 0.0, 0.016153044917852685,
      8.740292266666666e-05, 3.413333333333333e-07, 0.003901, 0.33957032000000004)),
    (("qwen2-7b", "a100-80gb", {"quantization": "fp8", "pipeline_parallel_size": 2}, "decode_1"),
     0.007063100122944799,
     (0.00426989217459539, 3.7873101193395455e-06, 3.779810495340853e-05, 0.0,
      0.0007129678260585254, 1.590991662579696e-06, 0.002029, 0.0)),
    (("qwen2-7b", "a100-80gb", {"quantization": "fp8", "pipeline_parallel_size": 2}, "decode_64"),
     0.009539159014453708,
     (0.004452976745463463, 0.00024238784763773092, 0.0019751009762955696, 0.0,
      0.0007257921830962891, 0.00010182346640510054, 0.002029, 0.0)),
    (("qwen2-7b", "a100-80gb", {"quantization": "fp8", "pipeline_parallel_size": 2}, "prefill_4096"),
     0.2848736657839376,
     (0.24475807218871792, 0.015512822248814779, 0.0, 0.021590233613128205,
      0.0007129678260585254, 1.590991662579696e-06, 0.002029, 0.0)),
]


@pytest.mark.parametrize("case, step_time, breakdown", DENSE_BEFORE_MOE)
def test_dense_models_cost_what_they_did_before_experts(case, step_time, breakdown):
    model, hardware, options, batch = case
    cost_model = analytical(model, hardware, **options)
    assert cost_model.routed_experts is None
    assert cost_model.step_time(BATCHES[batch]) == pytest.approx(step_time, rel=1e-12)
    assert tuple(cost_model.breakdown(BATCHES[batch]).values()) == pytest.approx(breakdown, rel=1e-12)


# --- the expected number of distinct experts ------------------------------------------------------------

def test_one_token_reads_its_k_experts_and_many_tokens_read_them_all():
    assert expected_distinct_experts(1, 8, 2) == 2.0
    assert expected_distinct_experts(1, 128, 8) == pytest.approx(8.0)
    assert expected_distinct_experts(0, 8, 2) == 0.0
    assert expected_distinct_experts(1000, 8, 2) == pytest.approx(8.0)
    assert expected_distinct_experts(4096, 128, 8) == pytest.approx(128.0)
    assert expected_distinct_experts(3, 8, 8) == 8.0  # top-k of all: every expert, every token
    # Two tokens: 2k minus the expected overlap, k * k / E.
    assert expected_distinct_experts(2, 8, 2) == pytest.approx(4 - 2 * 2 / 8)
    counts = [expected_distinct_experts(tokens, 60, 4) for tokens in range(1, 200)]
    assert counts == sorted(counts) and counts[-1] < 60


def test_a_one_token_step_reads_k_experts_weights():
    cost_model = analytical("mixtral-8x7b")
    experts = cost_model.routed_experts
    assert experts.num_experts == 8 and experts.experts_per_token == 2
    # One expert's gate+up and down in bf16 at the achievable bandwidth.
    bandwidth = resolve_hardware("h100-sxm").achievable_bandwidth
    assert experts.expert_weight_read_s == pytest.approx(3 * 4096 * 14336 * 2 / bandwidth)
    assert experts.time(1) == pytest.approx(2 * experts.expert_weight_read_s + 2 * experts.activation_s_per_row)
    description = cost_model.describe()
    assert description["weight_read_s_one_token"] < 0.3 * description["weight_read_s"]
    assert (description["num_experts"], description["num_experts_per_token"]) == (8, 2)
    assert description["active_parameters"] == resolve_model("mixtral-8x7b").active_parameters
    assert description["kernels_per_layer"] == 16
    # What a per-kernel profiler would see of one layer: the router and the two grouped GEMMs among them.
    operators = cost_model.layer_operator_times(1)
    assert {"router", "routed_experts", "moe_permute_and_combine", "router_top_k", "activation"} <= set(operators)
    assert "gate_up_proj" not in operators


# --- batch 1 like a dense model of the active size; then every expert wakes up --------------------------

def dense_twin(name: str):
    """A dense model with the MoE model's attention and an MLP as wide as its k experts together: the same
    parameters per token."""
    moe = resolve_model(name)
    return replace(moe, name=f"{name} dense twin", num_experts=0, num_experts_per_token=0, moe_intermediate_size=0,
                   shared_expert_intermediate_size=0,
                   intermediate_size=moe.num_experts_per_token * moe.moe_intermediate_size
                   + moe.shared_expert_intermediate_size)


def test_mixtral_decodes_one_request_about_as_fast_as_a_dense_model_of_its_active_size():
    twin = dense_twin("mixtral-8x7b")
    assert twin.num_parameters / 1e9 == pytest.approx(12.9, rel=0.01)
    hardware = resolve_hardware("h100-sxm")
    moe, dense = analytical("mixtral-8x7b"), AnalyticalCostModel(twin, hardware, "bfloat16")
    one = decode_batch(1)
    assert moe.step_time(one) == pytest.approx(dense.step_time(one), rel=0.15)
    # A dense model of the total size reads three and a half times the bytes.
    assert moe.step_time(one) < 0.4 * analytical("llama-2-70b").step_time(one)


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_decode_time_grows_faster_than_a_dense_twins_until_every_expert_is_read(name):
    moe = analytical(name, tensor_parallel_size=2)
    dense = AnalyticalCostModel(dense_twin(name), resolve_hardware("h100-sxm"), "bfloat16", tensor_parallel_size=2)
    moe_base, dense_base = moe.step_time(decode_batch(1)), dense.step_time(decode_batch(1))
    for requests in (2, 4, 8, 16):
        assert moe.step_time(decode_batch(requests)) - moe_base > dense.step_time(decode_batch(requests)) - dense_base
    # Once every expert is read, the experts' weights stop growing: the linear layers then grow by the
    # rows' activations only, slower than the dense twin's, which is still reading the same weights.
    experts = moe.routed_experts
    saturated = next(tokens for tokens in range(1, 10_000)
                     if expected_distinct_experts(tokens, experts.num_experts, experts.experts_per_token)
                     > 0.999 * experts.num_experts)
    linear = [moe.breakdown(decode_batch(tokens))["linear_layers"] for tokens in (saturated, 2 * saturated)]
    assert linear[1] < 1.05 * linear[0]


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(MOE_PRESETS), tensor_parallel_size=st.sampled_from([1, 2, 4]),
       requests=st.integers(1, 600), context=st.integers(1, 8000), prefill=st.integers(0, 2048))
def test_step_time_never_falls_when_a_decode_joins_the_batch(name, tensor_parallel_size, requests, context,
                                                               prefill):
    cost_model = analytical(name, tensor_parallel_size=tensor_parallel_size)
    chunk = ([prefill], [0]) if prefill > 1 else ([], [])

    def step(decodes: int) -> float:
        return cost_model.step_time(StepBatch(chunk[0] + [1] * decodes, chunk[1] + [context] * decodes))

    assert step(requests) <= step(requests + 1)


# --- fp8, tensor and pipeline parallelism ---------------------------------------------------------------

def test_fp8_halves_the_experts_weight_bytes_and_keeps_the_router_in_bf16():
    bf16, fp8 = analytical("qwen1.5-moe-a2.7b"), analytical("qwen1.5-moe-a2.7b", quantization="fp8")
    assert fp8.routed_experts.expert_weight_read_s == pytest.approx(bf16.routed_experts.expert_weight_read_s / 2)
    linears = {cost.name: cost for cost in fp8.layer_linears}
    bf16_linears = {cost.name: cost for cost in bf16.layer_linears}
    assert set(linears) == {"qkv_proj", "o_proj", "router", "shared_expert_gate_up", "shared_expert_down",
                            "shared_expert_gate"}
    for name in ("router", "shared_expert_gate"):
        assert linears[name].weight_read_s == bf16_linears[name].weight_read_s
    for name in ("shared_expert_gate_up", "shared_expert_down"):
        assert linears[name].weight_read_s == pytest.approx(bf16_linears[name].weight_read_s / 2)
    model = resolve_model("qwen1.5-moe-a2.7b")
    assert fp8.describe()["weight_bytes"] == model.weight_bytes("bfloat16") - model.linear_parameters
    # Batch 1 reads 4 of 60 experts, whose bytes halve: the step is faster, not twice as fast.
    assert fp8.step_time(decode_batch(1)) < bf16.step_time(decode_batch(1))


def test_tensor_parallelism_splits_each_expert_and_all_reduces_twice_per_layer():
    one, two = analytical("mixtral-8x7b"), analytical("mixtral-8x7b", tensor_parallel_size=2)
    assert two.routed_experts.expert_weight_read_s == pytest.approx(one.routed_experts.expert_weight_read_s / 2)
    assert two.routed_experts.num_experts == 8  # every GPU holds every expert's half
    assert two._allreduces_per_step == 2 * 32
    batch = decode_batch(32)
    assert two.breakdown(batch)["tensor_parallel_communication"] > 0
    assert two.step_time(batch) < one.step_time(batch)
    router = {cost.name: cost for cost in two.layer_linears}["router"]
    assert router.out_features == 8 and router.in_features == 4096  # replicated, not split


def test_pipeline_stages_share_the_experts_time():
    cost_model = analytical("mixtral-8x7b", pipeline_parallel_size=2)
    features = step_features(decode_batch(16))
    stages = cost_model.pipeline_stage_times(features)
    assert len(stages) == 2 and stages[0] == pytest.approx(stages[1], rel=0.1)
    assert cost_model.step_time_from_features(features) == pytest.approx(
        cost_model.engine_overhead_s(features) + sum(stages))


@pytest.mark.parametrize("name", MOE_PRESETS)
def test_step_flops_and_bytes_count_k_experts_of_compute_and_the_distinct_experts_weights(name):
    cost_model = analytical(name)
    model = resolve_model(name)
    one_flops, one_bytes = cost_model.step_flops_and_bytes(decode_batch(1, context=0))
    # One token: 2 FLOPs per active weight but the embedding (a row gathered, not multiplied).
    assert one_flops == pytest.approx(2 * (model.active_parameters - model.vocab_size * model.hidden_size), rel=0.01)
    # and the active weights' bytes (norms and biases aside).
    assert one_bytes == pytest.approx((model.active_parameters - model.vocab_size * model.hidden_size)
                                      * dtype_bytes("bfloat16"), rel=0.01)
    _, many_bytes = cost_model.step_flops_and_bytes(decode_batch(4096, context=0))
    weights = (model.num_parameters - model.vocab_size * model.hidden_size) * dtype_bytes("bfloat16")
    key_value_reads = 4096 * model.kv_bytes_per_token("bfloat16")  # each decode reads its one KV token
    assert many_bytes == pytest.approx(weights + key_value_reads, rel=0.01)


# --- other cost models ----------------------------------------------------------------------------------

def test_a_calibrated_dense_profile_for_an_moe_model_is_flagged_and_still_runs():
    profile = SHIPPED_PROFILES_DIR / "h200-small-bfloat16.json"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cost_model = load_cost_model(str(profile), resolve_model("mixtral-8x7b"), resolve_hardware("h200"),
                                     "bfloat16")
    assert any("fitted for model 'servesim-small', but this run uses 'mixtral-8x7b'" in str(w.message)
               for w in caught)
    assert cost_model.step_time(decode_batch(8)) > 0


# --- the example ---------------------------------------------------------------------------------------

def test_the_moe_example_runs_and_mixtral_decodes_faster_than_llama_3_70b(tmp_path):
    from sim.run import main as sim_run_main

    out = tmp_path / "moe"
    assert sim_run_main(["moe", "--set", "workload.num_requests=120", "--out", str(out), "--no-progress",
                         "--no-dashboard", "--quiet"]) == 0
    table = pd.read_csv(out / "sweep.csv").set_index("point")
    assert len(table) == 10
    for rate in (4, 64):
        mixtral, llama = table.loc[f"model=mixtral-8x7b,rate={rate}"], table.loc[f"model=llama-3-70b,rate={rate}"]
        assert mixtral.tpot_ms_p50 < llama.tpot_ms_p50
        assert mixtral.output_token_throughput >= llama.output_token_throughput
