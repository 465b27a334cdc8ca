"""One error type for every bad workload, listing every problem as ``field.path: message (got VALUE)``.

Pydantic reports problems in its own shape (a ``loc`` tuple, a message, the input). Users edit a YAML
file, so we speak in the dotted paths they typed, strip the union tags pydantic inserts into ``loc``
(``workload.arrival.poisson.rate`` is ``workload.arrival.rate`` in the file) and suggest the nearest
key when one is misspelled.

Cross-field checks run inside pydantic validators but know several paths at once; they raise
``problems_error(...)``, a ``PydanticCustomError`` carrying the list of (relative path, message, value),
which ``WorkloadError.from_validation_error`` expands back into separate lines.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from pydantic_core import PydanticCustomError

from workloads.schema_walk import walk_location

# Marks a problem that has no offending value to show (a missing key, for instance).
NO_VALUE: Any = type("NoValue", (), {"__repr__": lambda self: "NO_VALUE"})()

# The custom pydantic error type whose context carries a list of problems (see problems_error).
PROBLEMS_ERROR_TYPE = "workload_problems"

_MAX_VALUE_CHARS = 80


def format_value(value: Any) -> str:
    """A short, YAML-reader-friendly rendering of an offending value."""
    if isinstance(value, str):
        text = repr(value)
    elif value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    else:
        try:
            text = json.dumps(value, default=repr)
        except (TypeError, ValueError):
            text = repr(value)
    return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 3] + "..."


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a workload, at one dotted path."""

    path: str
    message: str
    value: Any = NO_VALUE

    def __str__(self) -> str:
        where = self.path or "(top level)"
        if self.value is NO_VALUE:
            return f"{where}: {self.message}"
        return f"{where}: {self.message} (got {format_value(self.value)})"


class WorkloadError(ValueError):
    """A workload that cannot be loaded or generated; ``problems`` lists every reason."""

    def __init__(self, problems: Sequence[Problem] | Problem | str, source: str | None = None) -> None:
        if isinstance(problems, str):
            problems = [Problem("", problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems: list[Problem] = list(problems)
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        lines = [str(problem) for problem in self.problems]
        if self.source is None and len(lines) == 1:
            return lines[0]
        count = f"{len(lines)} problem" + ("s" if len(lines) != 1 else "")
        header = f"invalid workload {self.source}" if self.source else "invalid workload"
        return f"{header} ({count}):\n" + "\n".join(f"  {line}" for line in lines)

    @classmethod
    def from_validation_error(cls, error: ValidationError, model: type, source: str | None = None) -> WorkloadError:
        return cls(problems_from_validation_error(error, model), source=source)


def join_path(*parts: str) -> str:
    return ".".join(part for part in parts if part)


def problems_error(problems: Iterable[tuple[str, str, Any]]) -> PydanticCustomError:
    """A pydantic error carrying several (path relative to the validated model, message, value)."""
    problem_list = [Problem(path, message, value) for path, message, value in problems]
    summary = "; ".join(str(problem) for problem in problem_list)
    return PydanticCustomError(PROBLEMS_ERROR_TYPE, "{summary}", {"summary": summary, "problems": problem_list})


def problems_from_validation_error(error: ValidationError, model: type) -> list[Problem]:
    problems: list[Problem] = []
    for detail in error.errors(include_url=False):
        location = walk_location(model, detail["loc"])
        base_path = location.path
        if detail["type"] == PROBLEMS_ERROR_TYPE:
            for inner in detail["ctx"]["problems"]:
                problems.append(Problem(join_path(base_path, inner.path), inner.message, inner.value))
            continue
        problems.append(_translate(detail, base_path, location.candidate_keys))
    return problems


def _translate(detail: dict[str, Any], path: str, candidate_keys: Sequence[str]) -> Problem:
    kind = detail["type"]
    value = detail.get("input", NO_VALUE)
    context = detail.get("ctx") or {}
    if kind == "missing":
        return Problem(path, "required key is missing")
    if kind == "extra_forbidden":
        unknown = path.rsplit(".", 1)[-1]
        message = "unknown key"
        close = difflib.get_close_matches(unknown, candidate_keys, n=1)
        if close:
            message += f"; did you mean {close[0]!r}?"
        elif candidate_keys:
            message += "; expected one of " + ", ".join(sorted(candidate_keys))
        return Problem(path, message, value)
    if kind == "union_tag_invalid":
        expected = context.get("expected_tags", "")
        return Problem(join_path(path, "type"), f"unknown type; expected one of {expected}", context.get("tag"))
    if kind == "union_tag_not_found":
        return Problem(join_path(path, "type"), "missing key 'type' that selects the kind", value)
    if kind == "model_type":
        return Problem(path, "must be a mapping of keys to values", value)
    if kind == "value_error":
        # Our own validators raise ValueError("message"); pydantic prefixes "Value error, ".
        message = str(context.get("error", detail["msg"]))
        return Problem(path, message, value)
    message = detail["msg"]
    return Problem(path, message[:1].lower() + message[1:], value)
