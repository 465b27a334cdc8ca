"""Calibrating multi-LoRA serving: the adapters' compute terms and the loads' costs fitted from recorded steps,
the profile that carries them, and the simulator that prices a LoRA workload with it (sim/calibrated_lora.py)."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.calibration_fit import fit_step_model, step_feature_frame
from sim.cost_models import CalibratedCostModel, StepFeatures, load_profile, save_profile
from sim.cost_models.calibrated import LORA_FEATURES
from sim.engine_setup import SetupError, build_setup
from sim.lora_load_fit import fit_load_costs
from sim.profile_match import SHIPPED_PROFILES_DIR
from sim.run_pipeline import simulate
from workloads import example_path, load_workload

# Known costs (seconds) of a synthetic engine: per step, per token, per request, per decode KV token, per adapter
# token and per distinct adapter; and per byte for an adapter's slot fill and its disk read.
TRUE = {"intercept": 0.010, "num_tokens": 2e-4, "num_reqs": 5e-4, "decode_context_tokens": 2e-6,
        "num_lora_tokens": 3e-5, "num_active_loras": 1.5e-3}
COPY_S_PER_BYTE, DISK_S_PER_BYTE = 1 / 4e9, 1 / 1e9


def synthetic_steps(num_steps: int = 600, seed: int = 1, lora: bool = True) -> pd.DataFrame:
    """Recorded-looking steps whose durations are the TRUE costs (and the loads) times 0.1% noise."""
    rng = np.random.default_rng(seed)
    decodes = rng.integers(1, 32, num_steps)
    prefill = np.where(rng.random(num_steps) < 0.3, rng.integers(2, 400, num_steps), 0)
    num_reqs = decodes + (prefill > 0)
    tokens = decodes + prefill
    context = decodes * rng.integers(20, 600, num_steps)
    # Each step its own share of requests on adapters, so that adapter tokens are not a fixed share of all tokens.
    lora_tokens = rng.binomial(tokens, rng.random(num_steps)) if lora else np.zeros(num_steps, int)
    adapters = np.where(lora_tokens > 0, np.minimum(rng.integers(1, 5, num_steps), np.maximum(lora_tokens, 1)), 0)
    loads = np.where(rng.random(num_steps) < 0.1, rng.integers(1, 3, num_steps), 0) * (adapters > 0)
    disk_loads = rng.binomial(loads, 0.5)
    size = np.where(rng.random(num_steps) < 0.5, 4e6, 8e6)  # two adapter shapes' bytes
    load_s = (loads * COPY_S_PER_BYTE + disk_loads * DISK_S_PER_BYTE) * size
    compute = (TRUE["intercept"] + TRUE["num_tokens"] * tokens + TRUE["num_reqs"] * num_reqs
               + TRUE["decode_context_tokens"] * context + TRUE["num_lora_tokens"] * lora_tokens
               + TRUE["num_active_loras"] * adapters)
    duration = compute * (1 + rng.normal(0, 0.001, num_steps)) + load_s
    steps = pd.DataFrame({
        "duration": duration, "num_scheduled_tokens": tokens, "num_reqs": num_reqs,
        "num_prefill_reqs": (prefill > 0).astype(int), "num_prefill_tokens": prefill, "num_decode_reqs": decodes,
        "decode_context_tokens": context, "prefill_context_tokens": 0, "prefill_attention_work": 0,
        "max_seq_len": 1000, "adapter_bytes": size})
    if lora:
        steps = steps.assign(num_lora_tokens=lora_tokens, num_active_loras=adapters, num_lora_loads=loads,
                             num_lora_disk_loads=disk_loads, lora_load_s=load_s)
    return steps


def test_a_lora_fit_recovers_known_adapter_costs_on_what_the_loads_leave():
    fit = fit_step_model(step_feature_frame(synthetic_steps()))
    for name in ("num_lora_tokens", "num_active_loras", "num_reqs", "decode_context_tokens"):
        assert fit.coefficients[name] == pytest.approx(TRUE[name], rel=0.02), name
    # (The per-step and per-token costs trade off with the small-batch table and slope changes the search may
    # keep; the adapters' terms are what this pins.)
    # Both adapter terms were tried, and the kept set is reported with its error on held-out adapter steps.
    assert set(fit.lora_feature_errors) == {"num_lora_tokens", "num_active_loras", "num_lora_tokens+num_active_loras"}
    summary = fit.error_summary()
    assert summary["lora_steps_median_ape"] == fit.lora_feature_errors["num_lora_tokens+num_active_loras"] < 0.01


def test_steps_without_adapters_fit_no_adapter_terms():
    fit = fit_step_model(step_feature_frame(synthetic_steps(200, lora=False)))
    assert not set(LORA_FEATURES) & set(fit.coefficients) and not fit.lora_feature_errors


def test_the_loads_fit_recovers_seconds_per_byte_or_a_per_load_constant():
    steps = synthetic_steps()
    fit = fit_load_costs(steps)
    assert fit.costs.kind == "per_byte"  # two adapter sizes: a cost per load misses one of them
    assert fit.costs.copy_s == pytest.approx(COPY_S_PER_BYTE, rel=0.02)
    assert fit.costs.disk_read_s == pytest.approx(DISK_S_PER_BYTE, rel=0.02)
    assert fit.summary()["median_ape_by_kind"]["per_load"] > 0.05
    constant = steps.assign(lora_load_s=steps["num_lora_loads"] * 2e-3 + steps["num_lora_disk_loads"] * 5e-3)
    fit = fit_load_costs(constant)
    assert (fit.costs.kind, fit.costs.copy_s, fit.costs.disk_read_s) == ("per_load", pytest.approx(2e-3),
                                                                          pytest.approx(5e-3))
    assert fit_load_costs(steps.assign(num_lora_loads=0)) is None


def lora_profile(tmp_path, **provenance):
    """A profile with the shipped CPU profile's base terms, adapter terms and fitted loads."""
    shipped = json.loads((SHIPPED_PROFILES_DIR / "cpu-small-float32.json").read_text())
    coefficients = dict(shipped["coefficients"], num_lora_tokens=3e-5, num_active_loras=1.5e-3)
    lora = {"max_lora_rank": 16, "adapter_ranks": [16], "target_modules": ["q_proj", "v_proj"], **provenance}
    path = tmp_path / "lora-profile.json"
    save_profile(path, coefficients, shipped["intercept_s"], dict(shipped["provenance"], lora=lora),
                 kind=shipped["kind"], hinges=shipped["hinges"],
                 token_count_offsets_s={int(count): value for count, value in shipped["token_count_offsets_s"].items()},
                 lora_loads={"kind": "per_byte", "copy_s": COPY_S_PER_BYTE, "disk_read_s": DISK_S_PER_BYTE})
    return path


def test_a_step_without_adapters_is_priced_exactly_as_the_base_profile_prices_it(tmp_path):
    with_lora = CalibratedCostModel.from_file(lora_profile(tmp_path))
    base = CalibratedCostModel.from_file(SHIPPED_PROFILES_DIR / "cpu-small-float32.json")
    for tokens, reqs, context in ((1, 1, 300), (3, 3, 900), (40, 8, 4000), (512, 3, 1200)):
        features = StepFeatures(num_reqs=reqs, num_tokens=tokens, num_prefill_reqs=1 if tokens > reqs else 0,
                                num_prefill_tokens=max(tokens - reqs + 1, 0) if tokens > reqs else 0,
                                num_decode_reqs=reqs - (tokens > reqs), decode_context_tokens=context,
                                prefill_context_tokens=0, prefill_attention_work=tokens * tokens // 2,
                                max_seq_len=600)
        assert with_lora.step_time_from_features(features) == base.step_time_from_features(features)
        adapted = replace(features, num_lora_tokens=tokens, num_active_loras=2)
        assert with_lora.step_time_from_features(adapted) == pytest.approx(
            base.step_time_from_features(features) + 3e-5 * tokens + 2 * 1.5e-3)


def test_old_profiles_load_and_write_back_unchanged(tmp_path):
    path = SHIPPED_PROFILES_DIR / "cpu-small-float32.json"
    profile = load_profile(path)
    assert profile.lora_loads is None and not profile.prices_lora
    assert json.dumps(profile.to_dict(), indent=2) + "\n" == path.read_text()
    written = load_profile(lora_profile(tmp_path))
    assert written.prices_lora and written.lora_loads["kind"] == "per_byte"
    bad = json.loads(lora_profile(tmp_path).read_text())
    bad["lora_loads"]["kind"] = "per_minute"
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"key 'lora_loads.kind' must be one of per_byte, per_load"):
        load_profile(tmp_path / "bad.json")


def cpu_lora_workload(*overrides):
    return load_workload(example_path("cpu_chat"), overrides=[
        "workload.num_requests=60", "engine.max_loras=2", "engine.max_lora_rank=16",
        "workload.lora={adapters: 5, rank: 16, target_modules: [q_proj, v_proj]}", *overrides])


def test_a_lora_profile_prices_a_cpu_lora_workload_its_loads_from_the_fitted_costs(tmp_path):
    setup = build_setup(cpu_lora_workload(), str(lora_profile(tmp_path)))
    from sim.lora_adapters import adapter_bytes

    adapter = next(iter(cpu_lora_workload().lora_adapters().values()))
    size = adapter_bytes(setup.model, adapter, setup.workload.dtype)
    assert setup.lora.copy_s[1] == pytest.approx(size * COPY_S_PER_BYTE)  # the cpu preset names no host link
    assert setup.lora.disk_read_s[1] == pytest.approx(size * DISK_S_PER_BYTE)
    # Fast-forward stays exact: the calibrated model reads the adapter counts each planned step carries.
    runs = [simulate(build_setup(cpu_lora_workload(), str(lora_profile(tmp_path))), fast_forward=fast)
            for fast in (True, False)]
    first, second = (run.step_columns() for run in runs)
    assert first["duration"] == second["duration"] and first["num_lora_tokens"] == second["num_lora_tokens"]
    assert sum(first["num_lora_loads"]) > 0 and sum(first["lora_load_s"]) > 0


def test_a_lora_workload_unlike_the_profiles_adapters_is_refused_or_warned(tmp_path):
    profile = str(lora_profile(tmp_path))
    with pytest.raises(SetupError, match=r"^workload\.lora: adapters of rank \[8\]"):
        build_setup(cpu_lora_workload("workload.lora.rank=8"), profile)
    with pytest.warns(UserWarning, match=r"engine\.max_lora_rank 32: the profile .* was fitted with 16"):
        build_setup(cpu_lora_workload("engine.max_lora_rank=32"), profile)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_setup(cpu_lora_workload(), profile)


def test_the_shipped_profile_refuses_a_lora_workload_saying_how_to_calibrate(capsys):
    with pytest.raises(SetupError, match=r"^workload\.lora: LoRA adapters need the analytical cost model or a "
                                         r"profile fitted on LoRA runs.*python -m sim\.calibrate"):
        build_setup(cpu_lora_workload(), str(SHIPPED_PROFILES_DIR / "cpu-small-float32.json"))
    from sim.validate import main as validate_main

    assert validate_main(["multi_lora", "--out", "/nonexistent/never"]) == 2
    error = capsys.readouterr().err
    assert "workload.lora: a LoRA workload is compared by sim.validate only with --profile" in error
    assert "python -m sim.calibrate" in error
    assert validate_main(["multi_lora", "--profile", str(SHIPPED_PROFILES_DIR / "cpu-small-float32.json"),
                          "--out", "/nonexistent/never"]) == 2
    assert "was fitted on steps without adapters" in capsys.readouterr().err


LORA_RUNS = Path(__file__).resolve().parents[2] / "sim" / "data" / "runs" / "cpu-small-float32-lora"
LORA_PROFILE = SHIPPED_PROFILES_DIR / "cpu-small-float32-lora.json"


def test_the_shipped_lora_profile_is_what_calibrate_fits_on_its_shipped_runs(tmp_path):
    from sim.calibrate import main as calibrate_main

    runs = [str(LORA_RUNS / f"lora-calibrate-{index}") for index in range(1, 6)] + [str(LORA_RUNS / "base-calibrate")]
    out = tmp_path / "profile.json"
    assert calibrate_main([*runs, "-o", str(out)]) == 0
    fitted, shipped = json.loads(out.read_text()), json.loads(LORA_PROFILE.read_text())
    assert fitted["features"] == shipped["features"] and {"num_lora_tokens", "num_active_loras"} <= set(fitted["features"])
    assert fitted["coefficients"] == pytest.approx(shipped["coefficients"], rel=1e-6, abs=1e-12)
    assert fitted["lora_loads"]["kind"] == shipped["lora_loads"]["kind"]
    for key in ("copy_s", "disk_read_s"):
        assert fitted["lora_loads"][key] == pytest.approx(shipped["lora_loads"][key], rel=1e-6)
    assert shipped["provenance"]["lora"]["max_lora_rank"] == 16


def test_the_shipped_lora_profile_is_never_the_default_and_validates_a_shipped_lora_run(tmp_path, capsys):
    from tests.sim.shipped_validation import check_named_profile_validates

    check_named_profile_validates(LORA_RUNS / "lora-few-adapters-1", LORA_PROFILE, LORA_RUNS / "base-calibrate",
                                  "a LoRA workload is compared by sim.validate only with --profile", tmp_path, capsys)


def test_calibration_refuses_lora_runs_of_different_adapter_shapes():
    from sim.calibrate import lora_shape

    rank_16 = {"max_lora_rank": 16, "adapter_ranks": [16], "target_modules": ["q_proj"], "adapter_bytes": 1e6}
    assert lora_shape([None, rank_16, dict(rank_16)], ["base", "a", "b"]) == rank_16
    assert lora_shape([None, None], ["base", "base-2"]) is None
    with pytest.raises(ValueError, match=r"the LoRA runs differ in max_lora_rank, adapter ranks or target modules"):
        lora_shape([rank_16, dict(rank_16, max_lora_rank=32)], ["a", "b"])
