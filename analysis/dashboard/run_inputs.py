"""The runs a dashboard shows: loaded once, labelled uniquely, each given its colour for every figure.

Inputs may be run directories, loaded `Run`s, or a sweep directory (one holding `sweep.csv` and a
run directory per point), which stands for all of its points in the sweep's order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.class_stats import class_thresholds_of
from analysis.metrics import SLO_METRICS, class_slo_mask, completed_mask, inter_token_latencies, request_latencies
from analysis.run_dir import SUMMARY_FILE, Run, read_run
from analysis.trace_schema import request_classes

SWEEP_TABLE_FILE = "sweep.csv"

# One colour per run, the same in every figure. Colour-blind-safe (Okabe-Ito order, then Tableau).
RUN_COLORS = (
    "#0072B2",  # blue
    "#D55E00",  # vermillion
    "#009E73",  # green
    "#CC79A7",  # purple
    "#E69F00",  # orange
    "#56B4E9",  # sky blue
    "#8C564B",  # brown
    "#7F7F7F",  # grey
    "#BCBD22",  # olive
    "#17BECF",  # cyan
)

RunInput = str | Path | Run


@dataclass(eq=False)
class DashboardRun:
    """One run as the dashboard sees it, with per-request metrics computed once and shared."""

    run: Run
    label: str
    color: str
    index: int
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def summary(self) -> dict:
        return self.run.summary

    @property
    def requests(self) -> pd.DataFrame:
        return self.run.requests

    @property
    def steps(self) -> pd.DataFrame:
        return self.run.steps

    @property
    def mode(self) -> str:
        return str(self.summary.get("mode") or "?")

    @property
    def latencies(self) -> pd.DataFrame:
        """Per completed request: request_id, ttft_ms, tpot_ms, e2e_ms, queue_ms."""
        if "latencies" not in self._cache:
            self._cache["latencies"] = request_latencies(self.requests)
        return self._cache["latencies"]

    @property
    def inter_token_ms(self) -> np.ndarray:
        if "itl" not in self._cache:
            self._cache["itl"] = inter_token_latencies(self.requests) * 1000.0
        return self._cache["itl"]

    @property
    def completed(self) -> np.ndarray:
        if "completed" not in self._cache:
            self._cache["completed"] = completed_mask(self.requests)
        return self._cache["completed"]

    @property
    def meets_slo(self) -> np.ndarray:
        """Per completed request (the rows of `latencies`): True when it met every SLO of its request
        class (the run's, for a run of one class).

        The rule of analysis.metrics' goodput: a value passes when <= its threshold, NaN fails, and
        a single-token request (TPOT undefined) passes any TPOT target, as vLLM counts it.
        """
        if "meets_slo" not in self._cache:
            thresholds = {key: float(value) for key, value in (self.summary.get("slo") or {}).items()
                          if value is not None and key in SLO_METRICS}
            classes = request_classes(self.requests)[self.completed]
            self._cache["meets_slo"] = class_slo_mask(self.latencies, classes, class_thresholds_of(self.summary),
                                                      thresholds)
        return self._cache["meets_slo"]


def expand_inputs(inputs: Iterable[RunInput]) -> list[Run]:
    """Load every input; a sweep directory expands to its points. Raises FileNotFoundError early."""
    runs: list[Run] = []
    for item in inputs:
        if isinstance(item, Run):
            runs.append(item)
            continue
        path = Path(item)
        if not (path / SUMMARY_FILE).is_file() and (path / SWEEP_TABLE_FILE).is_file():
            runs.extend(read_run(point) for point in sweep_point_dirs(path))
        else:
            runs.append(read_run(path))
    if not runs:
        raise ValueError("no runs given: pass at least one run directory")
    return runs


def sweep_point_dirs(sweep_dir: Path) -> list[Path]:
    """The run directories of a sweep, in the order of its sweep.csv.

    sweep.csv stores each point's directory as it was given to the sweep (possibly relative to the
    sweep's working directory), so a point is looked up there first and then by its label inside
    the sweep directory, which still works after the directory has been moved.
    """
    table = pd.read_csv(sweep_dir / SWEEP_TABLE_FILE)
    found: list[Path] = []
    for _, row in table.iterrows():
        candidates = []
        if isinstance(row.get("run_dir"), str):
            candidates += [Path(row["run_dir"]), sweep_dir / Path(row["run_dir"]).name]
        if isinstance(row.get("point"), str):
            candidates.append(sweep_dir / _safe_label(row["point"]))
        directory = next((c for c in candidates if (c / SUMMARY_FILE).is_file()), None)
        if directory is None:
            raise FileNotFoundError(f"sweep point {row.get('point')!r} of {sweep_dir} has no run directory")
        found.append(directory)
    return found


def _safe_label(label: str) -> str:
    # The sweep's rule for turning a point label into a directory name (sim.sweep._safe_label).
    return "".join(character if character.isalnum() or character in "._=-" else "_" for character in label)


def label_runs(runs: Sequence[Run]) -> list[DashboardRun]:
    """Give each run a unique label and its colour (by position, cycling past the palette)."""
    return [
        DashboardRun(run=run, label=label, color=RUN_COLORS[index % len(RUN_COLORS)], index=index)
        for index, (run, label) in enumerate(zip(runs, unique_labels(runs)))
    ]


def unique_labels(runs: Sequence[Run]) -> list[str]:
    """The run's name; where names collide (every point of a sweep shares the workload's name), the
    directory name, with the name in front when that helps; a number as the last resort."""
    names = [run.name or f"run {index}" for index, run in enumerate(runs)]
    if len(set(names)) == len(names):
        return names
    labels = []
    for name, run in zip(names, runs):
        directory = run.path.name if run.path is not None else ""
        labels.append(directory if directory and directory != name else name)
    if len(set(labels)) != len(labels):
        labels = [f"{label} #{index + 1}" for index, label in enumerate(labels)]
    return labels
