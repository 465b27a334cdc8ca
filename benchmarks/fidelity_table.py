"""The CPU fidelity table of the README, from the shipped real runs: no model, no GPU.

    python -m benchmarks.fidelity_table [--profile sim/data/profiles/cpu-small-float32.json]

For each validation workload: the simulation's relative error against each recording of it (the
latest in ``sim/data/runs/cpu-small-float32/``, earlier ones under ``repeats/N/``) and against each
metric's mean over all its recordings, where the machine's drift between recordings partly averages
out; then each recording against the mean of the others (the same workload, the same code, the same
quiet machine, minutes apart): the floor under any simulator's error on that machine.

The last column is the profile's error on the total time of the recording's own steps
(``sim/step_time_error.py``): the service-time error that the queues then amplify into latency error.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from analysis import read_run
from analysis.repeated_runs import compare_with_mean
from sim.validate import validate_recorded

RUNS = Path(__file__).resolve().parents[1] / "sim" / "data" / "runs" / "cpu-small-float32"
PROFILE = Path(__file__).resolve().parents[1] / "sim" / "data" / "profiles" / "cpu-small-float32.json"
WORKLOADS = ("cpu-chat", "cpu-overload", "cpu-long-prompts", "cpu-shared-prefix")
COLUMNS = (("request_throughput", "throughput"), ("ttft_ms.p50", "TTFT p50"), ("ttft_ms.p90", "TTFT p90"),
           ("tpot_ms.p50", "TPOT p50"), ("tpot_ms.p90", "TPOT p90"), ("e2e_ms.p50", "E2E p50"),
           ("e2e_ms.p90", "E2E p90"))


def recordings(workload: str) -> list[tuple[str, Path]]:
    """(label, run directory) of every recording of ``workload``: the latest first."""
    found = [("latest", RUNS / workload)]
    repeats = RUNS / "repeats"
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path, default=PROFILE)
    args = parser.parse_args(argv)
    print("| run | " + " | ".join(name for _, name in COLUMNS) + " | worst latency | step time |")
    print("|---|" + "---|" * (len(COLUMNS) + 2))
    with tempfile.TemporaryDirectory() as scratch:
        for workload in WORKLOADS:
            runs = recordings(workload)
            for label, run_dir in runs:
                comparison = validate_recorded(run_dir, Path(scratch) / workload / label.replace(" ", "-"),
                                               profile=args.profile)
                print(row(f"{workload}: simulated vs {label}", comparison["metrics"],
                          comparison["step_time_error"]["total"]))
            if len(runs) < 2:
                continue
            summaries = [read_run(run_dir).summary for _, run_dir in runs]
            # One workload, one profile: the simulation is the same whichever recording it was run for.
            simulated = read_run(Path(scratch) / workload / "latest" / "sim").summary
            print(row(f"{workload}: simulated vs mean of {len(runs)} recordings", compare_with_mean(simulated, summaries)))
            # The floor: each recording against the mean of the others, as the simulation is compared above.
            for index, (label, _) in enumerate(runs):
                others = summaries[:index] + summaries[index + 1:]
                print(row(f"{workload}: {label} vs mean of the other {len(others)} (real vs real)",
                          compare_with_mean(summaries[index], others)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
