"""The run directory: where one run (simulated, real or replayed) leaves its traces.

    <run_dir>/requests.parquet   one row per request   (schema: analysis.trace_schema.REQUESTS_SCHEMA)
    <run_dir>/steps.parquet      one row per engine step (schema: analysis.trace_schema.STEPS_SCHEMA)
    <run_dir>/summary.json       headline metrics and the configuration (analysis.metrics)
    <run_dir>/speed_probe.parquet   real runs only, optional: the machine-speed probe's steps
                                    (sim/speed_probe.py; read there, not here)

Both executors write through `write_run`, so a dashboard or a fidelity report never needs to know
which executor produced a directory.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from analysis.json_safe import json_safe
from analysis.trace_schema import (
    check_requests_frame,
    check_steps_frame,
    requests_table,
    steps_table,
    with_request_class,
)

REQUESTS_FILE = "requests.parquet"
STEPS_FILE = "steps.parquet"
SUMMARY_FILE = "summary.json"

# zstd: a 10,000-request trace with token timestamps compresses several-fold at little CPU cost.
PARQUET_COMPRESSION = "zstd"


@dataclass
class Run:
    """One run directory, loaded."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    summary: dict[str, Any]
    path: Path | None = None

    @property
    def name(self) -> str:
        return str(self.summary.get("name") or (self.path.name if self.path else ""))


def write_run(
    out_dir: str | Path,
    requests_columns: Mapping[str, Any] | pd.DataFrame | pa.Table,
    steps_columns: Mapping[str, Any] | pd.DataFrame | pa.Table,
    summary: Mapping[str, Any],
) -> Path:
    """Write requests.parquet, steps.parquet and summary.json into `out_dir` (created if needed).

    The columns are column-oriented (name -> list / numpy array), a DataFrame or an Arrow table; they
    are checked against the trace schema before anything is written, so a bad trace leaves no
    half-written directory behind. Returns the directory.
    """
    requests = requests_table(requests_columns)
    steps = steps_table(steps_columns)
    out_path = Path(out_dir)
    out_path.mkdir(parents=True, exist_ok=True)
    pq.write_table(requests, out_path / REQUESTS_FILE, compression=PARQUET_COMPRESSION)
    pq.write_table(steps, out_path / STEPS_FILE, compression=PARQUET_COMPRESSION)
    write_summary(out_path, summary)
    return out_path


def write_summary(out_dir: str | Path, summary: Mapping[str, Any]) -> Path:
    """Write summary.json (indent 2, strict JSON: numpy values converted, NaN written as null)."""
    path = Path(out_dir) / SUMMARY_FILE
    text = json.dumps(json_safe(dict(summary)), indent=2, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")
    return path


def read_run(run_dir: str | Path) -> Run:
    """Load a run directory; raise FileNotFoundError naming the first file that is missing."""
    path = Path(run_dir)
    if path.exists() and not path.is_dir():
        raise FileNotFoundError(f"{str(path)!r} is not a directory; expected a run directory (requests.parquet, "
                                "steps.parquet, summary.json)")
    if not path.is_dir():
        raise FileNotFoundError(f"run directory {str(path)!r} does not exist")
    for file_name in (REQUESTS_FILE, STEPS_FILE, SUMMARY_FILE):
        if not (path / file_name).is_file():
            raise FileNotFoundError(f"run directory {str(path)!r} has no {file_name}")
    # A run recorded before request classes has no request_class column: it reads as one class, "default".
    requests = with_request_class(pq.read_table(path / REQUESTS_FILE).to_pandas())
    steps = pq.read_table(path / STEPS_FILE).to_pandas()
    check_requests_frame(requests)
    check_steps_frame(steps)
    try:
        summary = json.loads((path / SUMMARY_FILE).read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path / SUMMARY_FILE} is not valid JSON: {error}") from error
    if not isinstance(summary, dict):
        # Every reader does summary.get(...): a list or a number would fail there with an AttributeError.
        raise ValueError(f"{path / SUMMARY_FILE} must hold a JSON object (the run's summary), got "
                         f"{type(summary).__name__}")
    return Run(requests=requests, steps=steps, summary=summary, path=path)
