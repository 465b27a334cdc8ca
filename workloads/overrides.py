"""``--set path=value`` overrides, applied to the raw YAML mapping before validation.

Applying them before validation means an override is checked exactly like the file itself. The path
is checked against the schema, not against the file: ``slo.ttft_ms=300`` is valid even when the file
has no ``slo`` section (the section is created), while ``engine.max_num_seq=1`` is an error naming
that path. Values are parsed as YAML (``yaml_loader.py``, so ``1e3`` is a number too) so ``8``, ``0.5``, ``true``, ``null``, ``[1, 2]``
and ``{type: gamma, rate: 4, cv: 2}`` mean what they would in the file.
"""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml
from pydantic import BaseModel

from workloads.errors import Problem, WorkloadError
from workloads.schema_walk import field_names, field_shape
from workloads.yaml_loader import load_yaml

Override = tuple[str, Any]

# "classes[1]" in a path: the same as "classes.1".
LIST_INDEX = re.compile(r"\[(\d+)\]")


def parse_override(text: str) -> Override:
    """``"engine.max_num_seqs=128"`` -> ``("engine.max_num_seqs", 128)``."""
    path, separator, value_text = text.partition("=")
    path = path.strip()
    if not separator or not path:
        raise WorkloadError(Problem("override", "must look like path.to.key=value", text))
    try:
        value = load_yaml(value_text) if value_text.strip() else None
    except yaml.YAMLError as error:
        raise WorkloadError(Problem(path, f"cannot parse the override's value as YAML ({error})", value_text)) from None
    return path, value


def as_override(item: str | Override) -> Override:
    return parse_override(item) if isinstance(item, str) else (item[0], item[1])


def apply_overrides(
    raw: Mapping[str, Any], overrides: Iterable[str | Override], root: type[BaseModel]
) -> dict[str, Any]:
    """A deep copy of ``raw`` with every override applied in order."""
    result = copy.deepcopy(dict(raw))
    for item in overrides:
        path, value = as_override(item)
        set_path(result, path, value, root)
    return result


def set_path(raw: dict[str, Any], path: str, value: Any, root: type[BaseModel]) -> None:
    """Set ``raw[path]`` in place, creating absent sections; the path must exist in the schema.

    An element of a list of sections is picked by position, written ``workload.classes.1.arrival.rate``
    or, as error messages print it, ``workload.classes[1].arrival.rate``."""
    parts = LIST_INDEX.sub(r".\1", path).split(".")
    if any(not part for part in parts):
        raise WorkloadError(Problem(path, "not a valid setting path (empty part)", value))
    node: dict[str, Any] = raw
    models: list[type[BaseModel]] | None = [root]
    index = 0
    while index < len(parts):
        part = parts[index]
        shown = ".".join(parts[: index + 1])
        if models is None:
            # Inside a free mapping (hardware, sweep): the rest of the path is one key.
            node[".".join(parts[index:])] = value
            return
        owner = next((model for model in models if part in model.model_fields), None)
        if owner is None:
            raise WorkloadError(Problem(shown, _unknown_message(part, models), value))
        if index == len(parts) - 1:
            node[part] = value
            return
        shape = field_shape(owner, part)
        assert shape is not None
        if shape.kind == "leaf":
            raise WorkloadError(Problem(shown, "is a single value, not a section with keys", node.get(part)))
        child = node.get(part)
        if shape.kind == "model_list":
            # A list of sections (workload.phases): the next part picks an existing element by position.
            position = parts[index + 1]
            items = child if isinstance(child, list) else []
            if not position.isdigit() or int(position) >= len(items):
                raise WorkloadError(Problem(f"{shown}.{position}", f"must be an index of the {len(items)} "
                                            f"entries of {shown} (0 to {len(items) - 1})", value))
            child = items[int(position)]
            if index + 1 == len(parts) - 1:
                items[int(position)] = value
                return
            index += 1
            models, node = [shape.model], child
            index += 1
            continue
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise WorkloadError(Problem(shown, "is not a mapping, so it has no keys to set", child))
        models = None if shape.kind == "mapping" else shape.models_for(child)
        node = child
        index += 1


def _unknown_message(part: str, models: list[type[BaseModel]]) -> str:
    names = field_names(models)
    close = difflib.get_close_matches(part, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else "; expected one of " + ", ".join(names)
    return "no such setting" + hint
