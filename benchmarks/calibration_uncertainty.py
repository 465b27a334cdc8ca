"""How far a simulated metric can move with the calibration recordings alone: a leave-one-out jackknife.

    python -m benchmarks.calibration_uncertainty [--profile sim/data/profiles/cpu-small-float32.json]
        [--runs RUN_DIR ...] [--workload cpu-chat ...]

A profile is fitted on a few recordings of a machine that drifts between them, so it is itself a
sample: fitted on other recordings of the same workload it would time steps (and share time between
kinds of step) a little differently, and a metric with a gain of several per percent of step time
would move by several percent. This refits the profile once without each calibration recording
(``sim.calibrate``, as shipped), simulates each validation workload's request stream with every refit,
and reports per metric the jackknife standard error of the simulated value, sqrt((n - 1) / n * sum of
squared deviations from the refits' mean), relative to the value the full profile simulates.

Beside it: the standard error of the recordings' own mean, the two combined, and the simulation's error
against that mean in units of the combined standard error. An error of one or two such units is what
nine calibration and seven validation recordings on that machine cannot tell from chance; several is
the model's.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

from analysis import read_run
from analysis.repeated_runs import compare_with_mean, standard_error_of_mean
from analysis.report import summary_value
from benchmarks.fidelity_table import COLUMNS, PROFILE, WORKLOADS, recordings
from sim.calibrate import calibrate
from sim.cost_models.calibrated import load_profile
from sim.validate import simulate_like

REPOSITORY = Path(__file__).resolve().parents[1]
# A combined standard error below this (0.1%) is no spread to measure an error in units of.
MEANINGFUL_SPREAD = 0.001


def jackknife_standard_error(values: list[float]) -> float:
    """The leave-one-out jackknife's standard error of a statistic from its n leave-one-out values."""
    count = len(values)
    mean = statistics.fmean(values)
    return math.sqrt((count - 1) / count * sum((value - mean) ** 2 for value in values))


def calibration_runs(profile: Path) -> list[Path]:
    """The recordings the profile was fitted on (its provenance names them relative to the repository)."""
    runs = load_profile(profile).provenance.get("source_runs") or []
    return [path if path.is_absolute() else REPOSITORY / path for path in map(Path, runs)]


def leave_one_out_simulations(runs: list[Path], workloads: list[str], scratch: Path,
                              fixed: dict[str, float] | None = None) -> dict[str, list[dict]]:
    """Per workload, the summaries of its latest recording's request stream simulated with each refit
    (``fixed``: coefficients taken as given, as the profile's own fit took them)."""
    simulated: dict[str, list[dict]] = {workload: [] for workload in workloads}
    latest = {workload: read_run(recordings(workload)[0][1]) for workload in workloads}
    for left_out in range(len(runs)):
        profile = scratch / f"without-{left_out}.json"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the recordings' own warnings were seen when they were fitted
            calibrate(runs[:left_out] + runs[left_out + 1:], profile, fixed=fixed)
        for workload in workloads:
            simulated[workload].append(simulate_like(latest[workload], profile, scratch / f"{workload}-{left_out}"))
    return simulated


def uncertainty_rows(workload: str, full: dict, refits: list[dict], real_summaries: list[dict]) -> list[str]:
    """Table rows for one workload: the profile's jackknife standard error, the recordings', combined,
    and the error against the recordings' mean in combined standard errors."""
    profile_error, recordings_error, combined, in_units = [], [], [], []
    against_mean = compare_with_mean(full, real_summaries)
    mean_error = standard_error_of_mean(real_summaries)
    for key, _ in COLUMNS:
        centre = summary_value(full, key)
        spread = jackknife_standard_error([summary_value(refit, key) for refit in refits])
        profile_part = spread / abs(centre) if centre else math.nan
        total = math.hypot(profile_part, mean_error[key] or 0.0)
        error = against_mean[key]["relative_error"]
        profile_error.append(f"±{profile_part:.1%}")
        recordings_error.append(f"±{mean_error[key] or 0.0:.1%}")
        combined.append(f"±{total:.1%}")
        # Throughput of an open-loop workload is its arrival rate: no spread, and no ratio to take.
        in_units.append(f"{error:+.1%} = {error / total:+.1f}" if total >= MEANINGFUL_SPREAD else f"{error:+.1%}")
    return [f"| {workload}: {label} | " + " | ".join(cells) + " |" for label, cells in (
        (f"profile, leave one of {len(refits)} recordings out", profile_error),
        (f"mean of {len(real_summaries)} recordings", recordings_error),
        ("combined standard error", combined),
        ("simulated vs mean, in combined standard errors", in_units))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path, default=PROFILE)
    parser.add_argument("--runs", type=Path, nargs="+", help="calibration recordings (default: the profile's own)")
    parser.add_argument("--workload", action="append", choices=WORKLOADS, help="default: all four")
    args = parser.parse_args(argv)
    runs = args.runs or calibration_runs(args.profile)
    fixed = load_profile(args.profile).provenance.get("fixed_coefficients")
    if len(runs) < 3:
        parser.error(f"a jackknife needs at least 3 calibration recordings, got {len(runs)}")
    workloads = args.workload or list(WORKLOADS)
    print("| workload: what | " + " | ".join(name for _, name in COLUMNS) + " |")
    print("|---|" + "---|" * len(COLUMNS))
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        refits = leave_one_out_simulations(runs, workloads, scratch, fixed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            calibrate(runs, scratch / "all.json", fixed=fixed)
        for workload in workloads:
            full = simulate_like(read_run(recordings(workload)[0][1]), scratch / "all.json", scratch / workload)
            real_summaries = [read_run(run_dir).summary for _, run_dir in recordings(workload)]
            for line in uncertainty_rows(workload, full, refits[workload], real_summaries):
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
