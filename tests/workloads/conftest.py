"""Shared fixtures for the workloads tests: a small valid workload and the shipped data files."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

import workloads

DATA_DIR = Path(workloads.__file__).resolve().parent / "data"

MINIMAL_WORKLOAD: dict[str, Any] = {
    "name": "unit",
    "seed": 7,
    "engine": {"max_num_seqs": 64, "max_num_batched_tokens": 2048},
    "workload": {
        "num_requests": 200,
        "arrival": {"type": "poisson", "rate": 5.0},
        "prompt_len": {"type": "uniform", "min": 8, "max": 64},
        "output_len": {"type": "constant", "value": 16},
    },
}


@pytest.fixture
def raw_workload() -> dict[str, Any]:
    """A fresh deep copy of a minimal valid workload mapping, for tests to modify."""
    return copy.deepcopy(MINIMAL_WORKLOAD)


@pytest.fixture
def data_dir() -> Path:
    return DATA_DIR


def set_dotted(raw: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """Set raw[path] (dotted), creating sections; returns raw for chaining."""
    node = raw
    *parents, last = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return raw


def delete_dotted(raw: dict[str, Any], path: str) -> dict[str, Any]:
    node = raw
    *parents, last = path.split(".")
    for part in parents:
        node = node[part]
    del node[last]
    return raw


@pytest.fixture
def set_path():
    return set_dotted


@pytest.fixture
def delete_path():
    return delete_dotted
