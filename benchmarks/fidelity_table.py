"""The CPU fidelity table of the README, from the shipped real runs: no model, no GPU.

    python -m benchmarks.fidelity_table [--profile sim/data/profiles/cpu-small-float32.json]

For each validation workload: the simulation's relative error against each recording of it (the
latest in ``sim/data/runs/cpu-small-float32/``, earlier ones under ``repeats/N/``) and against each
metric's mean over all its recordings, where the machine's drift between recordings partly averages
out, with the standard error of that mean (how well the recordings pin it down; the profile's own, from
its calibration recordings, is ``benchmarks.calibration_uncertainty``'s); then each recording against the
mean of the others (the same workload, the same code, the same quiet machine, minutes apart): the floor
under any simulator's error on that machine.

The last column is the profile's error on the total time of the recording's own steps
(``sim/step_time_error.py``): the service-time error that the queues then amplify into latency error.

Each recording also gets a diagnosis row: the simulation at the recording's own speed (the profile
scaled by the measured total of the recording's steps, so not a prediction): what error is left there
is the model's and the queues', the rest is the machine's speed during the recording.

Recordings that carry a speed probe (``sim/speed_probe.py``) get a second row: the simulation at the
machine's speed the probe measured around that recording, whose last column is the step-time error the
probe's speed left (how well the probe caught the run's own speed); then the mean of those simulations
against the mean of those recordings.

Last, the step-level figures over all recordings of each workload: the mean error of their total step
time and of how the profile shares their time between kinds of step, each with its standard error. A
change to the step-time model is best judged on these: they move by fractions of a point by chance,
the latency percentiles by several.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

from analysis import read_run
from analysis.fidelity import relative_error
from analysis.repeated_runs import compare_with_mean, mean_metrics, standard_error_of_mean
from sim.validate import step_time_sensitivity, validate_recorded

RUNS = Path(__file__).resolve().parents[1] / "sim" / "data" / "runs" / "cpu-small-float32"
PROFILE = Path(__file__).resolve().parents[1] / "sim" / "data" / "profiles" / "cpu-small-float32.json"
WORKLOADS = ("cpu-chat", "cpu-overload", "cpu-long-prompts", "cpu-shared-prefix")
COLUMNS = (("request_throughput", "throughput"), ("ttft_ms.p50", "TTFT p50"), ("ttft_ms.p90", "TTFT p90"),
           ("tpot_ms.p50", "TPOT p50"), ("tpot_ms.p90", "TPOT p90"), ("e2e_ms.p50", "E2E p50"),
           ("e2e_ms.p90", "E2E p90"))


def recordings(workload: str, runs: Path = RUNS) -> list[tuple[str, Path]]:
    """(label, run directory) of every recording of ``workload`` under ``runs``: the latest first."""
    found = [("latest", runs / workload)]
    repeats = runs / "repeats"
    if repeats.is_dir():
        found += [(f"repeat {folder.name}", folder / workload) for folder in sorted(repeats.iterdir())
                  if (folder / workload).is_dir()]
    return found


def row(label: str, metrics: dict, step_time: float | None = None) -> str:
    """One table row; ``step_time``: the profile's error on the recording's own steps' total time."""
    errors = [metrics[key]["relative_error"] for key, _ in COLUMNS]
    worst = max(abs(error) for error in errors[1:])
    steps = "" if step_time is None else f"{step_time:+.1%}"
    return f"| {label} | " + " | ".join(f"{error:+.1%}" for error in errors) + f" | {worst:.1%} | {steps} |"


def probed_rows(workload: str, probed: list[tuple[str, dict, dict]]) -> list[str]:
    """Rows for the recordings that carry a speed probe: the simulation at each one's probed speed."""
    rows = [row(f"{workload}: simulated at the probed speed ({comparison['machine_speed']['speed_factor'] - 1:+.1%})"
                f" vs {label}", comparison["metrics"], comparison["machine_speed"]["residual_step_time_error"])
            for label, comparison, _ in probed]
    if len(probed) > 1:
        rows.append(row(f"{workload}: mean of {len(probed)} simulations at the probed speed vs mean of those "
                        f"{len(probed)} recordings",
                        mean_against_mean([simulation for _, _, simulation in probed],
                                          [read_run(comparison["real_run"]).summary for _, comparison, _ in probed])))
    return rows


def mean_against_mean(simulations: list[dict], real_summaries: list[dict]) -> dict:
    """Each recording has its own simulation (its own speed): the mean of those against the mean of these."""
    simulated, real = mean_metrics(simulations), mean_metrics(real_summaries)
    return {key: {"relative_error": relative_error(simulated[key], real[key])} for key, _ in COLUMNS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path, default=PROFILE)
    parser.add_argument("--runs", type=Path, default=RUNS,
                        help="recordings laid out as the shipped ones: WORKLOAD/ (the latest) and repeats/N/WORKLOAD/")
    args = parser.parse_args(argv)
    print("| run | " + " | ".join(name for _, name in COLUMNS) + " | worst latency | step time |")
    print("|---|" + "---|" * (len(COLUMNS) + 2))
    sensitivities = {}
    step_level: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for workload in WORKLOADS:
            runs = recordings(workload, args.runs)
            probed, at_own_speed, own_speeds = [], [], []
            for label, run_dir in runs:
                out_dir = Path(scratch) / workload / label.replace(" ", "-")
                comparison = validate_recorded(run_dir, out_dir, profile=args.profile, at_probed_speed=True,
                                               sensitivity=False)
                at_profile_speed = comparison.get("at_profile_speed", comparison)
                print(row(f"{workload}: simulated vs {label}", at_profile_speed["metrics"],
                          comparison["step_time_error"]["total"]))
                step_level.setdefault(workload, []).append(comparison["step_time_error"])
                own = comparison["at_run_speed"]
                print(row(f"{workload}: simulated at its own speed ({own['speed_factor'] - 1:+.1%}, a diagnosis) vs {label}",
                          own["metrics"]))
                at_own_speed.append(read_run(out_dir / "sim-at-run-speed").summary)
                own_speeds.append(own["speed_factor"])
                if "at_profile_speed" in comparison:
                    probed.append((label, comparison, read_run(out_dir / "sim").summary))
            for line in probed_rows(workload, probed):
                print(line)
            # One workload, one profile: at the profile's speed the simulation is the same whichever
            # recording it was run for.
            latest = Path(scratch) / workload / "latest"
            simulated = read_run(latest / "sim-at-profile-speed" if (latest / "sim-at-profile-speed").is_dir()
                                 else latest / "sim").summary
            sensitivities[workload] = step_time_sensitivity(runs[0][1], args.profile, latest, simulated, 1.0)
            if len(runs) < 2:
                continue
            summaries = [read_run(run_dir).summary for _, run_dir in runs]
            print(row(f"{workload}: simulated vs mean of {len(runs)} recordings", compare_with_mean(simulated, summaries)))
            # How well the recordings pin their mean down (the profile's own uncertainty, from its
            # calibration recordings, is benchmarks.calibration_uncertainty's).
            standard_errors = standard_error_of_mean(summaries)
            print(f"| {workload}: standard error of the mean of {len(runs)} recordings | "
                  + " | ".join(f"±{standard_errors[key]:.1%}" for key, _ in COLUMNS) + " | | |")
            # What is left with each recording's total step time matched: how the profile shares time between
            # kinds of step, and the queues; the rest of the row above is the profile's speed on these runs.
            print(row(f"{workload}: mean of {len(runs)} simulations at each recording's own speed (mean "
                      f"{sum(own_speeds) / len(own_speeds) - 1:+.1%}, a diagnosis) vs mean of {len(runs)} recordings",
                      mean_against_mean(at_own_speed, summaries)))
            # The floor: each recording against the mean of the others, as the simulation is compared above.
            for index, (label, _) in enumerate(runs):
                others = summaries[:index] + summaries[index + 1:]
                print(row(f"{workload}: {label} vs mean of the other {len(others)} (real vs real)",
                          compare_with_mean(summaries[index], others)))
    print("\nPercent each metric moves per 1% more time in every step (simulated at the profile's speed +/-2%, "
          "for the latest recording):\n")
    print("| workload | " + " | ".join(name for _, name in COLUMNS[1:]) + " |")
    print("|---|" + "---|" * (len(COLUMNS) - 1))
    for workload, gains in sensitivities.items():
        print(f"| {workload} | " + " | ".join(f"{gains[key]:+.1f}" for key, _ in COLUMNS[1:]) + " |")
    print(step_level_table(step_level))
    return 0


def step_level_table(reports: dict[str, list[dict]]) -> str:
    """The step-level figures to judge a change of the model by, per workload over its recordings: the
    mean error of the recordings' total step time (the profile's speed on them) and the mean error in
    how it shares their time between kinds of step (``sim.step_time_error.time_sharing_error``), each
    with its standard error. They move by fractions of a point between recordings where the latency
    percentiles above move by several points."""
    lines = ["\nThe profile on the recordings' own steps (mean over the recordings, ± its standard error):\n",
             "| workload | recordings | total step time | time shared between kinds of step |", "|---|---|---|---|"]
    for workload, found in reports.items():
        cells = []
        for key, signed in (("total", True), ("sharing_error", False)):
            values = [report[key] for report in found]
            mean = statistics.fmean(values)
            spread = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan
            cells.append(f"{mean:+.2%} ±{spread:.2%}" if signed else f"{mean:.2%} ±{spread:.2%}")
        lines.append(f"| {workload} | {len(found)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
