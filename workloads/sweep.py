"""Expanding ``sweep:`` into one validated config per point, each with a short label.

A label names only what changes, by the last part of its path (``rate=4``), using more of the path
where two keys would otherwise read the same (``prompt_len.max=512,output_len.max=512``). Labels are
safe as directory names: the simulator writes one run directory per point. A file path as a value
(``workload.trace.path``, resolved against the YAML's directory) reads by its last parts, as few as tell
the sweep's files apart (``path=code.csv``), not as the absolute path the loader made of it.
"""

from __future__ import annotations

import itertools
import re
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from workloads.errors import WorkloadError
from workloads.overrides import apply_overrides

if TYPE_CHECKING:
    from workloads.config import WorkloadConfig

BASE_LABEL = "base"
_UNSAFE_LABEL_CHARACTERS = re.compile(r"[^A-Za-z0-9_.=,+-]")


def short_names(paths: list[str]) -> list[str]:
    """The shortest dotted suffix of each path that tells it apart from the others."""
    names = []
    for path in paths:
        parts = path.split(".")
        for length in range(1, len(parts) + 1):
            suffix = ".".join(parts[-length:])
            if all(other == path or not other.endswith("." + suffix) and other != suffix for other in paths):
                break
        names.append(suffix)
    return names


def format_label_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float, str)):
        return str(value)
    # A whole section as the value, e.g. {type: uniform, min: 1, max: 3}: its values read "uniform-1-3".
    if isinstance(value, dict):
        return "-".join(format_label_value(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return "-".join(format_label_value(item) for item in value)
    return str(value)


def short_file_names(values: list[Any]) -> dict[str, str]:
    """For a sweep key whose values are file paths: each path's shortest tail that no other value shares."""
    paths = [value for value in values if isinstance(value, str) and "/" in value]
    if not paths:
        return {}
    tails = {}
    for path in paths:
        parts = path.rstrip("/").split("/")
        for length in range(1, len(parts) + 1):
            tail = "/".join(parts[-length:])
            if all(other == path or not other.rstrip("/").endswith("/" + tail) for other in paths):
                break
        tails[path] = tail
    return tails


def section_entries_that_differ(values: list[Any]) -> list[set[str]] | None:
    """For a sweep key whose values are sections that would read alike by their values alone (``engine:
    [{tensor_parallel_size: 4}, {pipeline_parallel_size: 4}]``, both "4"), the keys of each value that not
    every value sets alike: a label then names them (``engine=pipeline_parallel_size=4``). None otherwise:
    sections that read apart keep the short form (``prompt_len=uniform-1-3``)."""
    if len(values) < 2 or not all(isinstance(value, dict) for value in values):
        return None
    if len({format_label_value(value) for value in values}) == len(values):
        return None
    common = {key for key in values[0] if all(key in value and value[key] == values[0][key] for value in values)}
    return [set(value) - common for value in values]


def point_label(paths: list[str], values: tuple[Any, ...], file_names: list[dict[str, str]] | None = None,
                differing: list[list[set[str]] | None] | None = None, indices: tuple[int, ...] | None = None) -> str:
    file_names = file_names or [{} for _ in paths]
    differing = differing or [None for _ in paths]
    pairs = []
    for position, (name, value, names) in enumerate(zip(short_names(paths), values, file_names, strict=True)):
        keys = differing[position][indices[position]] if differing[position] is not None else None
        if keys is not None:
            shown = "+".join(f"{key}={format_label_value(value[key])}" for key in value if key in keys)
            pairs.append(f"{name}={shown or BASE_LABEL}")
        else:
            pairs.append(f"{name}={format_label_value(names.get(value, value) if isinstance(value, str) else value)}")
    return _UNSAFE_LABEL_CHARACTERS.sub("_", ",".join(pairs))


def expand_sweep(config: WorkloadConfig) -> list[tuple[str, WorkloadConfig]]:
    """The cartesian product of the sweep's values, in the order written, validated point by point."""
    if not config.sweep:
        return [(BASE_LABEL, config)]
    paths = list(config.sweep)
    file_names = [short_file_names(config.sweep[path]) for path in paths]
    differing = [section_entries_that_differ(config.sweep[path]) for path in paths]
    base = config.model_dump(exclude={"sweep"})
    points = []
    labels: set[str] = set()
    for indices in itertools.product(*(range(len(config.sweep[path])) for path in paths)):
        values = tuple(config.sweep[path][index] for path, index in zip(paths, indices, strict=True))
        label = point_label(paths, values, file_names, differing, indices)
        if label in labels:  # values that read alike once made safe ("a b", "a_b"): one directory each
            label = next(f"{label}-{index}" for index in itertools.count(2) if f"{label}-{index}" not in labels)
        labels.add(label)
        raw = apply_overrides(base, list(zip(paths, values, strict=True)), type(config))
        try:
            points.append((label, type(config).model_validate(raw)))
        except ValidationError as error:
            raise WorkloadError.from_validation_error(error, type(config), source=f"sweep point {label}") from None
    return points
