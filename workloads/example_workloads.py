"""The example workloads shipped in ``workloads/examples/``, found by name."""

from __future__ import annotations

from pathlib import Path

from workloads.errors import Problem, WorkloadError

EXAMPLES_DIR = Path(__file__).resolve().parent / "examples"


def list_examples() -> list[str]:
    """The names of the shipped examples (file stems), sorted: ``["chat", "code_trace", ...]``."""
    return sorted(path.stem for path in EXAMPLES_DIR.glob("*.yaml"))


def example_path(name: str) -> Path:
    """The path of a shipped example, by name with or without ``.yaml``."""
    stem = name.removesuffix(".yaml")
    path = EXAMPLES_DIR / f"{stem}.yaml"
    if not path.is_file():
        raise WorkloadError(Problem("example", "no such example; shipped: " + ", ".join(list_examples()), name))
    return path
