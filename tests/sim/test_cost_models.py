"""Step features, the analytical roofline model, calibrated profiles and the cost-model factory."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cost_models import (AnalyticalCostModel, CalibratedCostModel, CostModel, StepBatch, StepFeatures,
                             load_cost_model, load_profile, make_provenance, save_profile, step_features)
from sim.cost_models.base import hardware_matches
from sim.hardware import HARDWARE_PRESETS, resolve_hardware
from sim.model_presets import MODEL_PRESETS, resolve_model

GB = 1e9


def analytical(model: str = "llama-2-7b", hardware: str = "a100-80gb", dtype: str = "float16") -> AnalyticalCostModel:
    return AnalyticalCostModel(resolve_model(model), resolve_hardware(hardware), dtype)


def decode_batch(num_reqs: int, context: int) -> StepBatch:
    return StepBatch(num_scheduled_tokens=[1] * num_reqs, num_computed_tokens=[context] * num_reqs)


# --- step_features -----------------------------------------------------------------------------------

def test_step_features_of_a_mixed_batch_by_hand():
    # two decodes (contexts 10 and 0), a fresh 5-token prompt, a 3-token chunk after 7 cached tokens
    features = step_features(StepBatch(num_scheduled_tokens=[1, 1, 5, 3], num_computed_tokens=[10, 0, 0, 7]))
    assert features == StepFeatures(
        num_reqs=4, num_tokens=10,
        num_prefill_reqs=2, num_prefill_tokens=8,
        num_decode_reqs=2,
        decode_context_tokens=(10 + 1) + (0 + 1),
        prefill_context_tokens=0 + 7,
        prefill_attention_work=5 * (0 + 6 / 2) + 3 * (7 + 4 / 2),  # 15 + 27
        max_seq_len=11,
        prefill_attention_dense_work=5 * (0 + 5) + 3 * (7 + 3),  # 25 + 30: the full score matrices
        context_prefill_dense_work=3 * (7 + 3),  # only the chunk after a cached context
        prefill_attention_sliced_work=5 * (0 + 5) + 3 * (7 + 3),  # chunks within one slice: the dense count
    )


def test_sliced_prefill_pairs_sum_each_slice_against_the_keys_up_to_its_last_row():
    from sim.cost_models.step_batch import PREFILL_QUERY_SLICE, sliced_prefill_pairs

    for query in (2, 127, 128, 129, 256, 300, 1024, 1500):
        for context in (0, 1, 512, 3000):
            by_slice = sum((min(query, start + PREFILL_QUERY_SLICE) - start) * (context + min(query, start + PREFILL_QUERY_SLICE))
                           for start in range(0, query, PREFILL_QUERY_SLICE))
            assert sliced_prefill_pairs(query, context) == by_slice, (query, context)
    # A 1024-token fresh prompt scores 8 slices: 128 * 128 * (1 + ... + 8), 56% of its dense matrix.
    assert sliced_prefill_pairs(1024, 0) == 128 * 128 * 36
    features = step_features(StepBatch(num_scheduled_tokens=[300, 1], num_computed_tokens=[40, 9]))
    assert features.prefill_attention_sliced_work == 128 * 168 + 128 * 296 + 44 * 340


def test_the_simulated_slice_is_the_torch_backends():
    pytest.importorskip("torch")
    from engine.runner.attention import torch_backend
    from sim.cost_models import step_batch

    assert step_batch.PREFILL_QUERY_SLICE == torch_backend.PREFILL_QUERY_SLICE


def test_step_features_of_an_empty_batch_is_all_zero():
    assert set(step_features(StepBatch([], [])).as_dict().values()) == {0}


def test_step_features_rejects_lists_of_different_length():
    with pytest.raises(ValueError, match="num_scheduled_tokens has 2 entries, num_computed_tokens 1"):
        step_features(StepBatch([1, 1], [0]))


def test_step_features_rejects_a_request_with_no_scheduled_token():
    with pytest.raises(ValueError, match="num_scheduled_tokens must be >= 1"):
        step_features(StepBatch([3, 0], [0, 5]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 60)), max_size=12))
def test_attention_work_counts_causal_query_key_pairs(requests):
    batch = StepBatch([q for q, _ in requests], [ctx for _, ctx in requests])
    features = step_features(batch)
    # Brute force: the i-th new token of a chunk (0-based) sees every cached token and itself and the
    # new tokens before it.
    pairs = sum(ctx + i + 1 for q, ctx in requests if q > 1 for i in range(q))
    assert features.prefill_attention_work == pairs
    assert features.decode_context_tokens == sum(ctx + 1 for q, ctx in requests if q == 1)
    assert features.num_prefill_tokens + features.num_decode_reqs == features.num_tokens
    assert features.num_prefill_reqs + features.num_decode_reqs == features.num_reqs


# --- analytical model --------------------------------------------------------------------------------

def test_analytical_model_satisfies_the_protocol_and_describes_itself_as_json():
    model = analytical()
    assert isinstance(model, CostModel)
    description = json.loads(json.dumps(model.describe()))
    assert description["kind"] == "analytical"
    assert description["hardware"]["name"] == "a100-80gb"
    # ridge point: 218 TFLOP/s * 2 bytes / (2 * 1529 GB/s) ~ 143 tokens
    assert 120 < description["ridge_point_tokens"] < 170


def test_decode_step_time_grows_with_batch_size():
    model = analytical()
    times = [model.step_time(decode_batch(n, 512)) for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)]
    assert times == sorted(times) and times[-1] > times[0]
    # Weight-bound: 64 short decodes cost little more than one (the whole point of batching). At long
    # contexts Llama-2-7B's KV (512 KiB per token, no grouped-query attention) outweighs the weights.
    assert model.step_time(decode_batch(64, 16)) < 1.1 * model.step_time(decode_batch(1, 16))
    assert model.step_time(decode_batch(64, 512)) > 1.5 * model.step_time(decode_batch(1, 512))


def test_decode_step_time_grows_with_context_length():
    model = analytical()
    times = [model.step_time(decode_batch(32, context)) for context in (0, 128, 1024, 4096, 16384, 65536)]
    assert times == sorted(times) and times[-1] > times[0]


def test_a_7b_decode_on_an_a100_reads_its_weights_at_a_plausible_rate():
    model = analytical("llama-2-7b", "a100-80gb")
    batch = decode_batch(1, 100)
    parts = model.breakdown(batch)
    forward = sum(parts.values()) - parts["fixed_overhead"]
    weight_bytes = resolve_model("llama-2-7b").weight_bytes("float16")
    assert 13.0 * GB < weight_bytes < 14.0 * GB
    # Never faster than reading the weights at the datasheet's 2039 GB/s (6.6 ms); 1.5 TB/s is 9 ms.
    assert weight_bytes / (2039 * GB) < forward < weight_bytes / (1.5e3 * GB)
    # The whole step, with kernel and CPU overheads: measured vLLM/gpt-fast figures are 9.5-12 ms.
    assert 0.008 < model.step_time(batch) < 0.013


def test_a_4096_token_prefill_is_compute_bound():
    model = analytical("llama-2-7b", "a100-80gb")
    batch = StepBatch([4096], [0])
    assert all(linear.is_compute_bound(4096) for linear in model.layer_linears)
    flops, _ = model.step_flops_and_bytes(batch)
    achieved = flops / model.step_time(batch)
    peak = resolve_hardware("a100-80gb").peak_flops("float16")
    # about 55 TFLOP of work: between half of peak and the GEMM efficiency the preset allows
    assert 0.5 * peak < achieved < 0.7 * peak


def test_breakdown_sums_to_step_time():
    model = analytical("llama-3-8b", "h100-sxm", "bfloat16")
    batch = StepBatch([1] * 30 + [512, 37], list(range(100, 130)) + [0, 2000])
    assert sum(model.breakdown(batch).values()) == pytest.approx(model.step_time(batch), rel=1e-12)


@settings(max_examples=150, deadline=None)
@given(hardware=st.sampled_from(sorted(HARDWARE_PRESETS)), model=st.sampled_from(sorted(MODEL_PRESETS)),
       requests=st.lists(st.tuples(st.integers(1, 3000), st.integers(0, 30000)), min_size=1, max_size=20))
def test_no_prediction_beats_the_datasheet(hardware, model, requests):
    """Whatever the batch, a step is never faster than its FLOPs at peak or its bytes at peak bandwidth."""
    cost_model = analytical(model, hardware, "bfloat16")
    batch = StepBatch([q for q, _ in requests], [ctx for _, ctx in requests])
    flops, bytes_moved = cost_model.step_flops_and_bytes(batch)
    spec = resolve_hardware(hardware)
    floor = max(flops / spec.peak_flops("bfloat16"), bytes_moved / (spec.memory_bandwidth_gbps * GB))
    assert cost_model.step_time(batch) >= floor


def test_layer_operator_times_cover_the_profiled_operators():
    times = analytical().layer_operator_times(1)
    assert set(times) == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "input_norm", "post_attention_norm",
                          "rope", "activation", "residual_add"}
    # One token: the gate+up projection reads its 4096 x 22016 fp16 weights and one row in and out at
    # 75% of 2039 GB/s, plus one kernel overhead.
    assert times["gate_up_proj"] == pytest.approx((4096 * 22016 + 4096 + 22016) * 2 / (2039e9 * 0.75) + 3e-6)


# --- calibrated profiles -----------------------------------------------------------------------------

PROVENANCE = {"hardware": "a100-80gb", "model": "llama-3-8b", "dtype": "bfloat16", "attention_backend": "flash_attn",
              "device": "NVIDIA A100-SXM4-80GB", "software": {"torch": "2.13.0", "python": "3.12.3"},
              "created": "2025-01-01T12:00:00+00:00", "source_runs": ["runs/a"],
              "fit_error": {"median_ape": 0.04, "p90_ape": 0.11}}
BATCH = StepBatch(num_scheduled_tokens=[1, 1, 100], num_computed_tokens=[50, 9, 20])
# features of BATCH: num_tokens 102, num_reqs 3, decode_context_tokens 51 + 10 = 61,
# prefill_attention_work 100 * (20 + 101 / 2) = 7050


def test_calibrated_profile_round_trips_and_predicts_by_hand(tmp_path):
    path = tmp_path / "profile.json"
    coefficients = {"num_tokens": 2e-5, "decode_context_tokens": 1e-8, "prefill_attention_work": 3e-11,
                    "num_reqs": 1e-5}
    saved = save_profile(path, coefficients, intercept_s=0.01, provenance=PROVENANCE)
    loaded = load_profile(path)
    assert loaded == saved
    model = CalibratedCostModel.from_file(path)
    assert isinstance(model, CostModel)
    expected = 0.01 + 2e-5 * 102 + 1e-8 * 61 + 3e-11 * 7050 + 1e-5 * 3
    assert model.step_time(BATCH) == pytest.approx(expected, rel=1e-12)
    assert json.loads(json.dumps(model.describe()))["profile"]["coefficients"] == coefficients
    assert json.loads(path.read_text())["format"] == "servesim-step-profile/1"


def test_piecewise_linear_profile_adds_hinges_above_their_knots(tmp_path):
    path = tmp_path / "piecewise.json"
    save_profile(path, {"num_tokens": 1e-6}, intercept_s=0.008, provenance=PROVENANCE, kind="piecewise_linear",
                 hinges=[{"feature": "num_tokens", "knot": 64, "coefficient": 2e-5},
                         {"feature": "num_reqs", "knot": 8, "coefficient": 1.0}])
    model = load_cost_model(str(path), resolve_model("llama-3-8b"), resolve_hardware("a100-80gb"), "bfloat16")
    assert model.step_time(BATCH) == pytest.approx(0.008 + 1e-6 * 102 + 2e-5 * (102 - 64), rel=1e-12)


def test_calibrated_step_time_is_floored_at_a_positive_value(tmp_path):
    path = tmp_path / "negative.json"
    save_profile(path, {"num_tokens": -1.0}, intercept_s=0.001, provenance=PROVENANCE)
    assert load_profile(path).minimum_step_time_s > 0
    assert CalibratedCostModel.from_file(path).step_time(BATCH) == load_profile(path).minimum_step_time_s


def test_make_provenance_fills_in_time_and_versions(tmp_path):
    provenance = make_provenance(hardware="cpu", model="tiny", dtype="float32", source_runs=["runs/x"],
                                 fit_error={"median_ape": 0.1, "p90_ape": 0.2})
    assert "python" in provenance["software"]
    save_profile(tmp_path / "p.json", {"num_tokens": 1e-4}, 0.002, provenance)  # accepted as is


def _valid_profile() -> dict:
    return {"format": "servesim-step-profile/1", "kind": "linear", "features": ["num_tokens", "num_reqs"],
            "coefficients": {"num_tokens": 1e-5, "num_reqs": 2e-5}, "intercept_s": 0.005,
            "provenance": dict(PROVENANCE)}


def _set(path: str, value):
    def mutate(profile: dict) -> None:
        *parents, last = path.split(".")
        target = profile
        for parent in parents:
            target = target[parent]
        if value is DELETE:
            del target[last]
        else:
            target[last] = value
    return mutate


DELETE = object()


@pytest.mark.parametrize("mutate, key", [
    (_set("format", "servesim-step-profile/0"), "'format'"),
    (_set("kind", "quadratic"), "'kind'"),
    (_set("coeficients", {}), "'coeficients'"),
    (_set("intercept_s", DELETE), "'intercept_s'"),
    (_set("intercept_s", "fast"), "'intercept_s'"),
    (_set("features", ["num_tokens", "num_requests"]), "'features[1]'"),
    (_set("coefficients.num_reqs", DELETE), "'coefficients.num_reqs'"),
    (_set("coefficients.num_tokens", float("nan")), "'coefficients.num_tokens'"),
    (_set("coefficients.max_seq_len", 1e-6), "'coefficients.max_seq_len'"),
    (_set("provenance.hardware", DELETE), "'provenance.hardware'"),
    (_set("provenance.created", "yesterday"), "'provenance.created'"),
    (_set("provenance.fit_error", {"median_ape": -1}), "'provenance.fit_error.median_ape'"),
    (_set("hinges", [{"feature": "num_tokens", "knot": 1, "coefficient": 1}]), "'hinges'"),
    (_set("kind", "piecewise_linear"), "'hinges'"),
    (_set("minimum_step_time_s", 0), "'minimum_step_time_s'"),
])
def test_loader_rejects_a_bad_profile_naming_the_key(tmp_path, mutate, key):
    profile = _valid_profile()
    mutate(profile)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(profile))
    with pytest.raises(ValueError, match=f"cost profile .*bad.json: key {re.escape(key)}"):
        load_profile(path)


def test_loader_rejects_invalid_json_and_missing_files(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="broken.json: is not valid JSON"):
        load_profile(path)
    with pytest.raises(ValueError, match="absent.json: cannot be read"):
        load_profile(tmp_path / "absent.json")


def test_save_profile_refuses_to_write_what_the_loader_would_reject(tmp_path):
    with pytest.raises(ValueError, match="unknown feature 'num_tokenz'"):
        save_profile(tmp_path / "p.json", {"num_tokenz": 1.0}, 0.0, PROVENANCE)
    assert not (tmp_path / "p.json").exists()


# --- the factory -------------------------------------------------------------------------------------

def test_load_cost_model_picks_the_model_from_the_spec(tmp_path):
    shape, hardware = resolve_model("llama-3-8b"), resolve_hardware("a100-80gb")
    for spec in (None, "analytical", {"kind": "analytical"}):
        assert isinstance(load_cost_model(spec, shape, hardware, "bfloat16"), AnalyticalCostModel)
    path = tmp_path / "p.json"
    save_profile(path, {"num_tokens": 1e-5}, 0.01, PROVENANCE)
    for spec in (str(path), path, {"kind": "calibrated", "path": str(path)}, _valid_profile()):
        assert isinstance(load_cost_model(spec, shape, hardware, "bfloat16"), CalibratedCostModel)


@pytest.mark.parametrize("spec, message", [
    ("roofline", "cost_model: expected 'analytical' or a path"),
    ({"kind": "magic"}, "cost_model.kind"),
    ({"kind": "analytical", "hardware": "h100-sxm"}, "cost_model: unknown key 'hardware'"),
    ({"kind": "calibrated"}, "cost_model.path"),
    (42, "cost_model: expected"),
])
def test_load_cost_model_rejects_a_bad_spec(spec, message):
    with pytest.raises(ValueError, match=message):
        load_cost_model(spec, resolve_model("tiny"), resolve_hardware("cpu"), "float32")


def test_a_profile_fitted_elsewhere_loads_with_a_warning(tmp_path):
    path = tmp_path / "p.json"
    save_profile(path, {"num_tokens": 1e-5}, 0.01, PROVENANCE)
    with pytest.warns(UserWarning, match="fitted for hardware 'a100-80gb', but this run uses 'h100-sxm'"):
        load_cost_model(str(path), resolve_model("llama-3-8b"), resolve_hardware("h100-sxm"), "bfloat16")


def test_an_empty_step_costs_only_the_engine_loop():
    model = analytical()
    assert model.step_time(StepBatch([], [])) == resolve_hardware("a100-80gb").step_overhead_s


def test_step_level_features_for_graph_replaying_engines():
    decode = step_features(StepBatch([1] * 5, [10] * 5))
    assert (decode.has_prefill, decode.decode_graph_batch) == (0, 8)
    assert step_features(StepBatch([1] * 8, [3] * 8)).decode_graph_batch == 8
    assert step_features(StepBatch([1], [3])).decode_graph_batch == 1
    mixed = step_features(StepBatch([1, 30], [10, 0]))
    assert (mixed.has_prefill, mixed.decode_graph_batch) == (1, 0)
    assert {"has_prefill", "decode_graph_batch"} <= set(decode.as_dict())


@pytest.mark.parametrize("fitted, device, preset, matches", [
    ("NVIDIA H200", "cuda:0", "h200", True),
    ("NVIDIA H100 80GB HBM3", "cuda:0", "h100-sxm", True),
    ("NVIDIA H100 80GB HBM3", "cuda:0", "a100-80gb", False),
    ("NVIDIA H200", "cuda:0", "cpu", False),
    ("AMD EPYC 7B13 (1 thread)", "cpu", "cpu", True),
    ("AMD EPYC 7B13 (1 thread)", "cpu", "h200", False),
    ("a100-80gb", "", "a100-80gb", True),
])
def test_hardware_matches_a_preset_to_the_device_a_profile_was_measured_on(fitted, device, preset, matches):
    assert hardware_matches(fitted, device, preset) is matches
