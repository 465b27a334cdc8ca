"""Calibration recovers a known step-time law from synthetic steps and writes a loadable profile."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

from analysis import steps_table, write_run, requests_table
from sim.calibrate import calibrate, main as calibrate_main, speed_standard_error
from sim.calibration_fit import fit_step_model, step_feature_frame
from sim.cost_models import StepFeatures, load_cost_model
from sim.cost_models.calibrated_range import calibrated_range, describe_extrapolation, extrapolation_report
from sim.hardware import resolve_hardware
from sim.model_presets import resolve_model


def synthetic_steps(num_steps=600, seed=0, noise=0.01):
    rng = np.random.default_rng(seed)
    decodes = rng.integers(0, 40, num_steps)
    prefill_reqs = rng.integers(0, 3, num_steps) * (rng.random(num_steps) < 0.3)
    prefill_tokens = prefill_reqs * rng.integers(20, 300, num_steps)
    decodes[(decodes + prefill_reqs) == 0] = 1
    context = decodes * rng.integers(50, 1500, num_steps)
    work = prefill_tokens * (prefill_tokens / np.maximum(prefill_reqs, 1) / 2 + 100)
    tokens = decodes + prefill_tokens
    reqs = decodes + prefill_reqs
    # The law: 2 ms per step, 30 us per token, 50 us per request, 0.01 us per KV token, 1e-4 us per pair.
    duration = 2e-3 + 30e-6 * tokens + 50e-6 * reqs + 1e-8 * context + 1e-10 * work
    duration *= 1 + noise * rng.standard_normal(num_steps)
    return pd.DataFrame({
        "step": np.arange(num_steps), "start_time": np.cumsum(duration) - duration, "duration": duration,
        "num_prefill_reqs": prefill_reqs, "num_decode_reqs": decodes, "num_scheduled_tokens": tokens,
        "num_prefill_tokens": prefill_tokens, "num_context_tokens": context, "num_running": reqs,
        "num_waiting": 0, "kv_blocks_used": 10, "kv_usage": 0.1, "num_preemptions": 0, "prefix_hit_tokens": 0,
        "prefix_query_tokens": 0, "prefill_attention_work": work, "decode_context_tokens": context,
        "prefill_context_tokens": 0, "num_reqs": reqs, "max_seq_len": 1500})


ONE_REQUEST = {"request_id": ["r0"], "arrival_time": [0.0], "first_token_time": [0.1], "finish_time": [0.2],
               "num_prompt_tokens": [10], "num_output_tokens": [2], "num_cached_tokens": [0], "num_preemptions": [0],
               "finish_reason": ["length"], "token_times": [[0.1, 0.2]]}
EXECUTOR = {"kind": "RealExecutor", "model": "servesim-tiny", "device": "cpu", "dtype": "float32",
            "attention_backend": "torch", "hardware": "test-cpu"}


def test_fit_recovers_a_known_law():
    fit = fit_step_model(step_feature_frame(synthetic_steps()))
    assert fit.error_summary()["median_ape"] < 0.015
    assert fit.intercept_s == pytest.approx(2e-3, rel=0.1)
    assert fit.coefficients["num_tokens"] + fit.coefficients["num_reqs"] == pytest.approx(80e-6, rel=0.1)


def test_held_out_error_by_kind_of_step():
    summary = fit_step_model(step_feature_frame(synthetic_steps())).error_summary()
    assert summary["num_decode_only_steps"] + summary["num_with_prefill_steps"] == summary["num_held_out_steps"]
    assert summary["num_with_prefill_steps"] > 10
    # 1% noise per step: medians near 0.7%, and errors on a sum of many steps mostly cancel.
    assert summary["decode_only_median_ape"] < 0.015 and summary["with_prefill_median_ape"] < 0.015
    assert 0 <= summary["total_time_ape"] < 0.005


def test_cli_writes_a_profile_the_simulator_loads(tmp_path, capsys):
    steps = synthetic_steps()
    write_run(tmp_path / "run", requests_table(ONE_REQUEST), steps_table(steps),
              {"name": "t", "mode": "real", "config": {"executor": EXECUTOR}})
    assert calibrate_main([str(tmp_path / "run"), "-o", str(tmp_path / "profile.json")]) == 0
    printed = capsys.readouterr().out
    assert "held-out steps" in printed and "median |error| by step: decode-only" in printed
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile["provenance"]["hardware"] == "test-cpu" and profile["provenance"]["fit_error"]["median_ape"] < 0.02
    # The region the fit saw is recorded: the largest of each feature among the calibration steps.
    assert profile["provenance"]["calibrated_range"]["decode_context_tokens"] == steps["decode_context_tokens"].max()
    assert profile["provenance"]["calibrated_range"]["num_reqs"] == steps["num_reqs"].max()
    with pytest.warns(UserWarning, match="fitted for hardware 'test-cpu', but this run uses 'h100-sxm'"):
        load_cost_model(str(tmp_path / "profile.json"), resolve_model("tiny"), resolve_hardware("h100-sxm"), "float32")
    # The generic "cpu" preset is whatever CPU the profile was measured on: no warning about hardware.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = load_cost_model(str(tmp_path / "profile.json"), resolve_model("tiny"), resolve_hardware("cpu"),
                                "float32")
    assert not [warning for warning in caught if "hardware" in str(warning.message)]
    features = StepFeatures(num_reqs=10, num_tokens=10, num_prefill_reqs=0, num_prefill_tokens=0, num_decode_reqs=10,
                            decode_context_tokens=5000, prefill_context_tokens=0, prefill_attention_work=0,
                            max_seq_len=600)
    expected = 2e-3 + 30e-6 * 10 + 50e-6 * 10 + 1e-8 * 5000
    assert model.step_time_from_features(features) == pytest.approx(expected, rel=0.05)


def test_calibration_refuses_simulated_runs(tmp_path, capsys):
    write_run(tmp_path / "sim", requests_table({"request_id": [], "arrival_time": [], "first_token_time": [],
                                                "finish_time": [], "num_prompt_tokens": [], "num_output_tokens": [],
                                                "num_cached_tokens": [], "num_preemptions": [], "finish_reason": [],
                                                "token_times": []}),
              steps_table(synthetic_steps(30)), {"name": "s", "mode": "sim", "config": {}})
    assert calibrate_main([str(tmp_path / "sim"), "-o", str(tmp_path / "p.json")]) == 2
    assert "calibrate from real runs" in capsys.readouterr().err


def test_step_level_features_are_derived_alike_for_fitting_and_simulating():
    """The fit derives has_prefill and decode_graph_batch on a whole table; the simulator reads the
    StepFeatures properties: both must agree on every recorded step, or the fit prices the wrong thing."""
    from pathlib import Path

    run = Path(__file__).resolve().parents[2] / "sim" / "data" / "runs" / "cpu-small-float32" / "cpu-calibrate"
    frame = step_feature_frame(pd.read_parquet(run / "steps.parquet"))
    names = StepFeatures.__slots__
    for _, row in frame.iterrows():
        features = StepFeatures(**{name: int(row[name]) for name in names})
        assert (features.has_prefill, features.decode_graph_batch) == (row["has_prefill"], row["decode_graph_batch"])
    assert set(frame["has_prefill"]) == {0.0, 1.0} and frame["decode_graph_batch"].max() >= 32


def test_extrapolation_report_counts_the_steps_beyond_the_calibrated_range():
    calibrated = calibrated_range(step_feature_frame(synthetic_steps()))
    run = step_feature_frame(synthetic_steps(num_steps=50, seed=1))
    inside = extrapolation_report(run, calibrated)
    assert inside["steps_beyond"] == 0 and not inside["features"] and describe_extrapolation(inside) is None
    wider = run.copy()
    wider.loc[:9, "decode_context_tokens"] = 2 * calibrated["decode_context_tokens"]
    wider.loc[:9, "duration"] = 1.0  # the ten steps beyond carry most of the step time
    report = extrapolation_report(wider, calibrated)
    assert report["steps_beyond"] == 10 and set(report["features"]) == {"decode_context_tokens"}
    assert report["features"]["decode_context_tokens"]["run_max"] == 2 * calibrated["decode_context_tokens"]
    assert report["time_fraction_beyond"] == pytest.approx(10 / (10 + run["duration"][10:].sum()))
    assert "10 of 50 steps" in describe_extrapolation(report) and "decode_context_tokens" in describe_extrapolation(report)


def test_a_simulated_run_beyond_its_profile_says_so(tmp_path):
    from sim.run_pipeline import run_simulation
    from workloads import example_path, load_workload

    write_run(tmp_path / "run", requests_table(ONE_REQUEST), steps_table(synthetic_steps()),
              {"name": "t", "mode": "real", "config": {"executor": EXECUTOR}})
    assert calibrate_main([str(tmp_path / "run"), "-o", str(tmp_path / "profile.json")]) == 0
    workload = load_workload(example_path("cpu_shared_prefix"), overrides=["workload.num_requests=40"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the synthetic profile names another model
        summary = run_simulation(workload, None, cost_model=str(tmp_path / "profile.json")).summary
    report = summary["cost_model_extrapolation"]
    # Prompts of 560-900 tokens fill steps with more tokens than any synthetic step had (at most 624).
    assert report["steps_beyond"] > 0 and report["features"]["num_tokens"]["calibrated_max"] == 624
    # Features the calibration runs never recorded (all zero there) have no range to leave.
    assert "prefill_attention_dense_work" not in report["features"]


def test_calibration_warns_about_a_run_recorded_on_a_busy_machine(tmp_path, capsys):
    write_run(tmp_path / "run", requests_table(ONE_REQUEST), steps_table(synthetic_steps()),
              {"name": "t", "mode": "real", "config": {"executor": EXECUTOR},
               "machine_load": {"cpus": 2, "other_processes_cpus": 0.95}})
    with pytest.warns(UserWarning, match="0.95 CPUs busy"):  # the API warns through ``warnings``
        calibrate([tmp_path / "run"], tmp_path / "api.json")
    # The CLI prints it as one "warning: ..." line, not Python's "file:line: UserWarning" and source line.
    assert calibrate_main([str(tmp_path / "run"), "-o", str(tmp_path / "profile.json")]) == 0
    err = capsys.readouterr().err
    assert f"warning: {tmp_path / 'run'}: other processes kept 0.95 CPUs busy" in err and "UserWarning" not in err


def test_calibration_reports_recordings_that_ran_at_different_speeds(tmp_path, capsys):
    """Two recordings of the same law, one measured 8% slower throughout (a shared machine's drift): the
    joint fit misses each by about half that in opposite directions, and the CLI says so."""
    steps = synthetic_steps()
    for name, factor in (("steady", 1.0), ("slow", 1.08)):
        write_run(tmp_path / name, requests_table(ONE_REQUEST), steps_table(steps.assign(duration=steps["duration"] * factor)),
                  {"name": name, "mode": "real", "config": {"executor": EXECUTOR}})
    runs = [str(tmp_path / "steady"), str(tmp_path / "slow")]
    assert calibrate_main(runs + ["-o", str(tmp_path / "profile.json")]) == 0
    errors = json.loads((tmp_path / "profile.json").read_text())["provenance"]["recording_errors"]
    assert errors[runs[0]] == pytest.approx(0.04, abs=0.015) and errors[runs[1]] == pytest.approx(-0.037, abs=0.015)
    captured = capsys.readouterr()
    assert "total step time by recording: steady +" in captured.out
    # Two recordings: the standard error of their mean is |a - b| / sqrt(2) / sqrt(2).
    standard_error = speed_standard_error(errors)
    assert standard_error == pytest.approx(abs(errors[runs[0]] - errors[runs[1]]) / 2)
    assert f"the profile's speed is their mean, within {standard_error:.1%}" in " ".join(captured.out.split())
    assert speed_standard_error({runs[0]: 0.01}) is None
    assert "recordings ran at different speeds" in captured.err
    # Recordings that agree draw no warning.
    assert calibrate_main([runs[0], runs[0], "-o", str(tmp_path / "same.json")]) == 0
    assert "different speeds" not in capsys.readouterr().err


def test_a_fixed_coefficient_is_taken_as_given_and_the_rest_fitted_around_it():
    features = step_feature_frame(synthetic_steps())
    right = fit_step_model(features, fixed={"num_reqs": 50e-6})  # the law's own value
    assert right.coefficients["num_reqs"] == 50e-6
    assert right.intercept_s == pytest.approx(2e-3, rel=0.1)
    assert right.coefficients["num_tokens"] == pytest.approx(30e-6, rel=0.1)
    assert np.median(np.abs(right.held_out_errors)) < 0.015
    # Fixed three times too high: kept as given, and no other term can take the excess back.
    wrong = fit_step_model(features, fixed={"num_reqs": 150e-6})
    assert wrong.coefficients["num_reqs"] == 150e-6
    assert np.median(np.abs(wrong.held_out_errors)) > 3 * np.median(np.abs(right.held_out_errors))


def test_cli_fix_records_the_coefficient_and_rejects_bad_ones(tmp_path, capsys):
    write_run(tmp_path / "run", requests_table(ONE_REQUEST), steps_table(synthetic_steps()),
              {"name": "t", "mode": "real", "config": {"executor": EXECUTOR}})
    out = tmp_path / "profile.json"
    assert calibrate_main([str(tmp_path / "run"), "-o", str(out), "--fix", "kv_block_runs=1.18e-5"]) == 0
    assert "(fixed)" in capsys.readouterr().out
    profile = json.loads(out.read_text())
    assert profile["coefficients"]["kv_block_runs"] == 1.18e-5
    assert profile["provenance"]["fixed_coefficients"] == {"kv_block_runs": 1.18e-5}
    for bad, named in (("num_tokens=1e-5", "'num_tokens' is not a feature that can be fixed"),
                       ("bogus=1", "'bogus' is not a feature"), ("kv_block_runs", "expected FEATURE=SECONDS"),
                       ("kv_block_runs=-1e-6", "kv_block_runs=-1e-06 must be a finite, non-negative")):
        assert calibrate_main([str(tmp_path / "run"), "-o", str(tmp_path / "bad.json"), "--fix", bad]) == 2
        assert named in capsys.readouterr().err
