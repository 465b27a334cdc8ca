"""Median step durations of recorded runs, split into decode-only and mixed steps (a quick look at runs).

    python -m benchmarks.step_medians RUN_DIR [RUN_DIR ...]

For each run: steps, the median duration of decode-only steps and of steps with a prefill chunk, the
longest step (a compilation or collector pause inside a measured run shows up here), and medians of
the features that drive step cost. Reads ``steps.parquet`` only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd


def describe(run_dir: Path) -> str:
    steps = pd.read_parquet(run_dir / "steps.parquet")
    mixed = steps[steps["num_prefill_reqs"] > 0]
    decode = steps[steps["num_prefill_reqs"] == 0]

    def median_ms(frame: pd.DataFrame) -> str:
        return f"{1e3 * frame['duration'].median():.2f} ms" if len(frame) else "-"

    return (f"{run_dir}: {len(steps)} steps; decode-only {len(decode)} at median {median_ms(decode)} "
            f"({decode['num_reqs'].median():.0f} requests); mixed {len(mixed)} at median {median_ms(mixed)} "
            f"({mixed['num_prefill_tokens'].median():.0f} prefill tokens, {mixed['num_reqs'].median():.0f} requests); "
            f"longest step {1e3 * steps['duration'].max():.1f} ms (step {int(steps['duration'].idxmax())})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.step_medians", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR", help="recorded run directories")
    args = parser.parse_args(argv)
    missing = [str(run_dir) for run_dir in args.run_dirs if not (run_dir / "steps.parquet").is_file()]
    if missing:
        parser.error(f"no steps.parquet in {', '.join(missing)}")
    for run_dir in args.run_dirs:
        print(describe(run_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
