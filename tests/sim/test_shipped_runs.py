"""The shipped real runs (CPU and H200), used where no GPU and no model is: each shipped profile is what
``sim.calibrate`` makes of its shipped calibration run, and ``sim.validate --real-run`` compares a recorded
run with its simulation.

The runs and where they were recorded: ``sim/data/runs/*/README.md``. Nothing here needs torch or a GPU:
calibration and simulation read only the recorded step and request tables.
"""

import json
import shutil
import statistics
from pathlib import Path

import pytest

from sim.calibrate import main as calibrate_main
from sim.validate import main as validate_main

DATA = Path(__file__).resolve().parents[2] / "sim" / "data"
# Profile, its calibration runs (the CPU one: nine recordings of cpu_calibrate), a recorded validation run
# (on the CPU the workload whose recordings agree best with one another: cpu_chat's lie within about 4%
# of one another in total step time, cpu_overload's 7%, which would make a fixed bound here a statement
# about that machine, not the pipeline).
CASES = [("cpu-small-float32", ("cpu-calibrate", *(f"cpu-calibrate-{index}" for index in range(2, 10))), "cpu-chat"),
         ("h200-small-bfloat16", ("gpu-calibrate",), "gpu-chat")]


@pytest.mark.parametrize("name,calibration_runs,_", CASES)
def test_a_shipped_profile_is_what_calibrate_fits_on_its_shipped_runs(tmp_path, name, calibration_runs, _):
    out = tmp_path / "profile.json"
    assert calibrate_main([str(DATA / "runs" / name / run) for run in calibration_runs] + ["-o", str(out)]) == 0
    fitted, shipped = json.loads(out.read_text()), json.loads((DATA / "profiles" / f"{name}.json").read_text())
    assert fitted["features"] == shipped["features"]
    assert fitted["coefficients"] == pytest.approx(shipped["coefficients"], rel=1e-6, abs=1e-12)
    assert fitted["intercept_s"] == pytest.approx(shipped["intercept_s"], rel=1e-6)
    hinges = [(hinge["feature"], hinge["knot"], hinge["coefficient"]) for hinge in shipped.get("hinges", [])]
    assert [(hinge["feature"], hinge["knot"]) for hinge in fitted.get("hinges", [])] == [h[:2] for h in hinges]
    assert [hinge["coefficient"] for hinge in fitted.get("hinges", [])] == pytest.approx([h[2] for h in hinges])
    if "speed_probe" in shipped["provenance"]:  # the CPU profile: its last three recordings carry a probe
        assert fitted["provenance"]["speed_probe"]["reference_ratio"] == pytest.approx(
            shipped["provenance"]["speed_probe"]["reference_ratio"], rel=1e-6)
        assert len(fitted["provenance"]["speed_probe"]["by_run"]) == 3


def test_the_gpu_profile_records_its_hardware():
    provenance = json.loads((DATA / "profiles" / "h200-small-bfloat16.json").read_text())["provenance"]
    assert provenance["hardware"] == "NVIDIA H200"
    assert provenance["attention_backend"] == "triton" and provenance["executor"]["cuda_graphs"] is True


@pytest.mark.parametrize("name,_,real_run", CASES)
def test_validate_against_a_recorded_run(tmp_path, capsys, name, _, real_run):
    """A loose bound guarding the offline pipeline; the per-workload figures are in the README."""
    out = tmp_path / "validate"
    assert validate_main(["--real-run", str(DATA / "runs" / name / real_run), "--profile",
                          str(DATA / "profiles" / f"{name}.json"), "--out", str(out), "--no-dashboard"]) == 0
    comparison = json.loads((out / "comparison.json").read_text())
    metrics = comparison["metrics"]
    assert abs(metrics["request_throughput"]["relative_error"]) < 0.03
    for key in ("ttft_ms.p50", "tpot_ms.p50", "e2e_ms.p50"):
        assert abs(metrics[key]["relative_error"]) < 0.25, (key, metrics[key])
    assert abs(comparison["step_time_error"]["total"]) < 0.1
    printed = " ".join(capsys.readouterr().out.split())
    assert "largest headline error" in printed and "the real run's own" in printed
    # The CPU profile's nine calibration recordings pin its speed down; the GPU profile has one recording.
    assert ("The profile's speed is known within 0.7%" in printed) is name.startswith("cpu")


def test_validate_notes_a_recording_that_was_time_shared(tmp_path, capsys):
    recorded = tmp_path / "cpu-chat"
    shutil.copytree(DATA / "runs" / "cpu-small-float32" / "cpu-chat", recorded)
    summary = json.loads((recorded / "summary.json").read_text())
    summary["machine_load"]["steps_on_cpu_fraction"] = 0.55
    (recorded / "summary.json").write_text(json.dumps(summary))
    assert validate_main(["--real-run", str(recorded), "--out", str(tmp_path / "validate"), "--no-dashboard"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "on a CPU for only 55% of its steps' wall time" in printed


def test_validate_needs_exactly_one_of_workload_and_real_run(capsys):
    for argv in ([], ["cpu_chat", "--real-run", "somewhere"]):
        with pytest.raises(SystemExit) as exit_info:
            validate_main(argv)
        assert exit_info.value.code == 2
    assert "--real-run RUN_DIR" in capsys.readouterr().err
    assert validate_main(["--real-run", str(DATA / "runs" / "missing-run")]) == 2


def test_the_fidelity_table_covers_every_recording(capsys):
    from benchmarks.fidelity_table import main as fidelity_main

    assert fidelity_main([]) == 0
    printed = capsys.readouterr().out
    for workload in ("cpu-chat", "cpu-overload", "cpu-long-prompts", "cpu-shared-prefix"):
        assert f"{workload}: simulated vs latest" in printed and f"{workload}: repeat 2 vs mean of the other 6" in printed
        assert f"{workload}: simulated vs mean of 7 recordings" in printed
        assert f"{workload}: standard error of the mean of 7 recordings | ±" in printed
        assert f"{workload}: mean of 7 simulations at each recording's own speed (mean " in printed
        # The last three recordings carry a speed probe; every one gets the diagnosis at its own speed.
        assert f"{workload}: mean of 3 simulations at the probed speed vs mean of those 3 recordings" in printed
        assert printed.count(f"{workload}: simulated at its own speed") == 7
        assert f"| {workload} | " in printed  # its row of the sensitivity table


@pytest.mark.parametrize("campaign, recordings, expected", [
    ("2026-12-01", 5, {"cpu-chat": 30.4, "cpu-overload": 23.6, "cpu-long-prompts": 39.4, "cpu-shared-prefix": 36.9}),
    ("2026-12-01-07h", 4, {"cpu-chat": 17.2, "cpu-overload": 17.8, "cpu-long-prompts": 41.0, "cpu-shared-prefix": 22.9}),
    ("2026-12-01-11h", 4, {"cpu-chat": 24.2, "cpu-overload": 30.3, "cpu-long-prompts": 66.3, "cpu-shared-prefix": 61.4}),
])
def test_the_later_campaigns_reproduce_their_tables(capsys, campaign, recordings, expected):
    """The 2026-12-01 recordings (a slower, drifting machine) through --runs: the shipped profile's worst latency
    error against their mean is the figure docs/fidelity.md and the README quote."""
    from benchmarks.fidelity_table import main as fidelity_main

    assert fidelity_main(["--runs", str(DATA / "runs" / "cpu-small-float32" / campaign)]) == 0
    printed = capsys.readouterr().out
    worst = {}
    for line in printed.splitlines():
        if f": simulated vs mean of {recordings} recordings |" in line:
            worst[line.split(":")[0].strip("| ")] = float(line.split("|")[-3].strip().rstrip("%"))
    assert worst == expected


def test_jackknife_standard_error_of_a_known_sample():
    from benchmarks.calibration_uncertainty import jackknife_standard_error

    # Leave-one-out means of 1, 2, 3, 4: (9, 8, 7, 6) / 3; the jackknife gives the mean's usual standard error.
    leave_one_out = [(10 - value) / 3 for value in (1, 2, 3, 4)]
    assert jackknife_standard_error(leave_one_out) == pytest.approx(statistics.stdev([1, 2, 3, 4]) / 2)


def test_calibration_uncertainty_refits_without_each_recording(capsys):
    from benchmarks.calibration_uncertainty import calibration_runs, main as uncertainty_main

    runs = calibration_runs(DATA / "profiles" / "cpu-small-float32.json")
    assert len(runs) == 9 and all(run.is_dir() for run in runs)
    assert uncertainty_main(["--runs", *map(str, runs[:3]), "--workload", "cpu-overload"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| cpu-overload")]
    assert [row.split(":")[1].split("|")[0].strip() for row in rows] == [
        "profile, leave one of 3 recordings out", "mean of 7 recordings", "combined standard error",
        "simulated vs mean, in combined standard errors"]
    # Three refits on different recordings simulate different latencies: a spread, not zeros.
    assert any(cell.strip() not in ("±0.0%", "") for cell in rows[0].split("|")[3:])


def test_step_medians_describes_a_recorded_run_and_names_a_missing_one(capsys):
    from benchmarks.step_medians import main as step_medians_main

    assert step_medians_main([str(DATA / "runs" / "cpu-small-float32" / "cpu-overload")]) == 0
    assert "cpu-overload: 881 steps; decode-only" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        step_medians_main(["--help-me"])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit):
        step_medians_main(["/nonexistent-run"])
    assert "no steps.parquet in /nonexistent-run" in capsys.readouterr().err


@pytest.mark.parametrize("recording", ["cpu-sessions", "cpu-sessions-2"])
def test_a_shipped_real_run_of_sessions_replays_exactly(recording):
    from analysis import requests_table, steps_table
    from sim.replay import compare_replay, replay

    recorder, run, _ = replay(DATA / "runs" / "cpu-small-float32" / "sessions" / recording)
    replayed = requests_table(recorder.request_columns()).to_pandas()
    report = compare_replay(run, replayed, steps_table(recorder.step_columns()).to_pandas())
    assert report.identical, report.describe()
    # Every later turn resent its conversation; the replay's turns find in the cache what the real ones found.
    real = run.requests.set_index("request_id").sort_index()
    replayed = replayed.set_index("request_id").sort_index()
    assert (real["turn"] > 1).sum() == 125
    assert real["num_cached_tokens"].tolist() == replayed["num_cached_tokens"].tolist()
    assert real["num_prompt_tokens"].tolist() == replayed["num_prompt_tokens"].tolist()


def test_the_xeon_campaign_reproduces_its_table(capsys, tmp_path):
    """Another CPU (2026-12-02-xeon): a profile refitted on its three calibration recordings, then the table of
    docs/fidelity.md's "Another CPU" section (worst latency error against the mean of three recordings)."""
    from benchmarks.fidelity_table import main as fidelity_main

    campaign = DATA / "runs" / "cpu-small-float32" / "2026-12-02-xeon"
    profile = tmp_path / "xeon.json"
    assert calibrate_main([str(campaign / f"cpu-calibrate-{n}") for n in (2, 3, 4)] + ["-o", str(profile)]) == 0
    fit = json.loads(profile.read_text())["provenance"]
    assert round(100 * fit["fit_error"]["median_ape"], 1) == 3.7 and fit["hardware"].startswith("Intel(R) Xeon(R)")
    capsys.readouterr()
    assert fidelity_main(["--runs", str(campaign), "--profile", str(profile)]) == 0
    worst = {}
    for line in capsys.readouterr().out.splitlines():
        if ": simulated vs mean of 3 recordings |" in line:
            worst[line.split(":")[0].strip("| ")] = float(line.split("|")[-3].strip().rstrip("%"))
    assert worst == {"cpu-chat": 7.9, "cpu-overload": 2.7, "cpu-long-prompts": 20.1, "cpu-shared-prefix": 22.3}
