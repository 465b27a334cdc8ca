"""The YAML loader for workload files and ``--set`` values: PyYAML's safe loader, with two changes.

- A key written twice in one mapping is an error (YAML would keep the last one silently).
- ``1e3``, ``1.5e3`` and ``2.5E-4`` are numbers, as in YAML 1.2 and as every user expects. PyYAML
  implements YAML 1.1, where an exponent float needs a dot and a signed exponent (``1.0e+3``), so
  ``--set workload.arrival.rate=1e3`` reached the schema as the string "1e3" and was refused as "not a
  valid number".
"""

from __future__ import annotations

import re
from typing import Any

import yaml

# Exponent floats, the exponent's sign optional and the dot too: the forms YAML 1.1's resolver lacks.
_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")


class WorkloadYAMLLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


WorkloadYAMLLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789."))


def load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=WorkloadYAMLLoader)  # noqa: S506 - a SafeLoader subclass
