"""Loading a workload: YAML file (or text, or mapping) + ``--set`` overrides -> ``WorkloadConfig``.

Every failure is a ``WorkloadError``: a YAML syntax error names the file, line and column; a schema
problem names the dotted field path and the value. Relative trace paths are resolved against the YAML
file's directory (against the working directory for a mapping), so a workload file and its trace can
move together.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from workloads.config import WorkloadConfig
from workloads.errors import Problem, WorkloadError
from workloads.overrides import Override, apply_overrides
from workloads.yaml_loader import load_yaml


def parse_yaml(text: str, source: str) -> Any:
    try:
        return load_yaml(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "somewhere"
        reason = getattr(error, "problem", None) or str(error)
        raise WorkloadError(Problem(source, f"malformed YAML at {where}: {reason}")) from None


def load_workload(
    source: str | os.PathLike[str] | Mapping[str, Any],
    overrides: Iterable[str | Override] = (),
) -> WorkloadConfig:
    """Load and validate a workload from a YAML file path or an already-parsed mapping."""
    if isinstance(source, Mapping):
        return _validate(dict(source), overrides, base_dir=Path.cwd(), label=None)
    path = Path(source)
    try:
        text = path.read_text()
    except OSError as error:
        raise WorkloadError(Problem(str(path), f"cannot read the workload file ({error.strerror or error})")) from None
    except UnicodeDecodeError as error:
        # A file saved as UTF-16 (Windows editors do) or a binary file: named, not a bare codec message.
        raise WorkloadError(Problem(str(path), f"cannot read the workload file (not UTF-8 text: {error.reason} "
                                               f"at byte {error.start})")) from None
    return _validate(parse_yaml(text, str(path)), overrides, base_dir=path.resolve().parent, label=str(path))


def load_workload_text(
    text: str,
    overrides: Iterable[str | Override] = (),
    base_dir: str | os.PathLike[str] | None = None,
) -> WorkloadConfig:
    """Load a workload from YAML text; relative trace paths resolve against ``base_dir`` (default: cwd)."""
    raw = parse_yaml(text, "<text>")
    return _validate(raw, overrides, base_dir=Path(base_dir) if base_dir else Path.cwd(), label="<text>")


def _validate(raw: Any, overrides: Iterable[str | Override], base_dir: Path, label: str | None) -> WorkloadConfig:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise WorkloadError(Problem("", "a workload must be a mapping of keys to values", raw), source=label)
    try:
        raw = apply_overrides(raw, overrides, WorkloadConfig)
    except WorkloadError as error:
        raise WorkloadError(error.problems, source=label) from None
    _resolve_trace_path(raw, base_dir)
    try:
        return WorkloadConfig.model_validate(raw)
    except ValidationError as error:
        raise WorkloadError.from_validation_error(error, WorkloadConfig, source=label) from None


def _resolve_trace_path(raw: dict[str, Any], base_dir: Path) -> None:
    # The trace file, and every trace file a sweep tries, is read relative to the YAML's directory: a
    # sweep run from another directory must find the same files as the base workload does.
    workload = raw.get("workload")
    _resolve_path_key(workload.get("trace") if isinstance(workload, dict) else None, base_dir)
    classes = workload.get("classes") if isinstance(workload, dict) else None
    for request_class in classes if isinstance(classes, list) else ():
        _resolve_path_key(request_class.get("trace") if isinstance(request_class, dict) else None, base_dir)
    sweep = raw.get("sweep")
    if not isinstance(sweep, dict):
        return
    paths = sweep.get("workload.trace.path")
    if isinstance(paths, list):
        sweep["workload.trace.path"] = [_resolved(path, base_dir) for path in paths]
    traces = sweep.get("workload.trace")
    for trace in traces if isinstance(traces, list) else ():
        _resolve_path_key(trace, base_dir)


def _resolve_path_key(trace: Any, base_dir: Path) -> None:
    if isinstance(trace, dict) and "path" in trace:
        trace["path"] = _resolved(trace["path"], base_dir)


def _resolved(path: Any, base_dir: Path) -> Any:
    if isinstance(path, str) and path and not Path(path).expanduser().is_absolute():
        return str((base_dir / path).resolve())
    return path
