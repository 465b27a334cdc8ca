"""The fit with one speed per recording (sim/recording_speeds.py): a machine's drift between recordings is
taken out of the costs, and the profile's level is the chosen recordings'."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analysis import requests_table, steps_table, write_run
from sim.calibrate import main as calibrate_main
from sim.calibration_fit import fit_step_model, step_feature_frame
from sim.recording_speeds import fit_with_recording_speeds
from tests.sim.test_calibration import EXECUTOR, ONE_REQUEST, synthetic_steps


def two_recorded_step_traces(slow_factor=1.10):
    """Recording 0: mostly decode-only steps at the law's speed. Recording 1: mostly steps with prefill
    chunks, all 10% slower (the machine drifted). Fitted together without speeds, the drift looks like
    prefill being dear."""
    steps = synthetic_steps(4000, seed=3)
    with_prefill = steps["num_prefill_reqs"] > 0
    decode_heavy = pd.concat([steps[~with_prefill].iloc[:900], steps[with_prefill].iloc[:100]])
    prefill_heavy = pd.concat([steps[~with_prefill].iloc[900:1200], steps[with_prefill].iloc[100:800]])
    prefill_heavy = prefill_heavy.assign(duration=prefill_heavy["duration"] * slow_factor)
    return [frame.reset_index(drop=True).assign(step=np.arange(len(frame))) for frame in (decode_heavy, prefill_heavy)]


def two_recordings():
    return [step_feature_frame(steps).assign(recording=index) for index, steps in enumerate(two_recorded_step_traces())]


def prefill_step_error(fit, law_steps):
    """The fit's error on the total time of steps with a prefill chunk, measured at the law's speed."""
    features = step_feature_frame(law_steps)
    chunked = features["num_prefill_reqs"].to_numpy() > 0
    return fit.predict(features)[chunked].sum() / features["duration"].to_numpy()[chunked].sum() - 1


def test_the_speeds_take_the_drift_out_of_the_costs():
    features = pd.concat(two_recordings(), ignore_index=True)
    fit, speeds = fit_with_recording_speeds(features, level_recordings=[0])
    assert speeds[0] == pytest.approx(1.0) and speeds[1] == pytest.approx(1.10, abs=0.01)
    fresh = synthetic_steps(2000, seed=11)  # the law at recording 0's speed, neither recording's steps
    assert abs(prefill_step_error(fit, fresh)) < 0.01
    # The plain fit takes recording 1's slowness for the cost of prefill: its prefill steps come out dear.
    plain = fit_step_model(features)
    assert prefill_step_error(plain, fresh) > 0.03
    # Held out, each step is priced at its recording's speed: only the 1% noise is left.
    assert fit.error_summary()["median_ape"] < 0.012 < plain.error_summary()["median_ape"]


def test_the_level_is_the_chosen_recordings_mean_speed():
    features = pd.concat(two_recordings(), ignore_index=True)
    _, speeds = fit_with_recording_speeds(features, level_recordings=[1])
    assert speeds[1] == pytest.approx(1.0) and speeds[0] == pytest.approx(1 / 1.10, abs=0.01)
    _, speeds = fit_with_recording_speeds(features)  # all of them: their speeds average 1
    assert speeds.mean() == pytest.approx(1.0) and speeds[1] / speeds[0] == pytest.approx(1.10, abs=0.01)
    with pytest.raises(ValueError, match=r"level recordings \[2\] are not among the 2 recordings"):
        fit_with_recording_speeds(features, level_recordings=[2])
    with pytest.raises(ValueError, match="at least two recordings"):
        fit_with_recording_speeds(two_recordings()[0])


def test_cli_records_the_speeds_and_names_bad_flags(tmp_path, capsys):
    runs = []
    for index, steps in enumerate(two_recorded_step_traces()):
        runs.append(str(tmp_path / f"run{index}"))
        write_run(tmp_path / f"run{index}", requests_table(ONE_REQUEST), steps_table(steps),
                  {"name": f"run{index}", "mode": "real", "config": {"executor": EXECUTOR}})
    out = tmp_path / "profile.json"
    assert calibrate_main(runs + ["-o", str(out), "--speed-per-recording", "--speed-level", runs[0]]) == 0
    captured = capsys.readouterr()
    provenance = json.loads(out.read_text())["provenance"]
    assert provenance["recording_speeds"][runs[0]] == pytest.approx(1.0)
    assert provenance["recording_speeds"][runs[1]] == pytest.approx(1.10, abs=0.01)
    assert provenance["speed_level_runs"] == [runs[0]]
    assert "run1 1.1" in captured.out and "the profile's level is the mean of 1 of them" in captured.out
    assert "different speeds" not in captured.err  # the drift was fitted: no warning to record more
    # Several level recordings after one flag (as a shell glob gives them), the same as the flag repeated.
    both = tmp_path / "both.json"
    assert calibrate_main(runs + ["--speed-per-recording", "--speed-level", *runs, "-o", str(both)]) == 0
    assert json.loads(both.read_text())["provenance"]["speed_level_runs"] == runs
    capsys.readouterr()
    for flags, named in ((["--speed-level", runs[0]], "--speed-level sets the level of a fit with --speed-per-recording"),
                         (["--speed-per-recording", "--speed-level", str(tmp_path / "elsewhere")],
                          f"--speed-level {tmp_path / 'elsewhere'}: not among the run directories")):
        assert calibrate_main(runs + ["-o", str(tmp_path / "bad.json")] + flags) == 2
        assert named in capsys.readouterr().err
    assert not (tmp_path / "bad.json").exists()
