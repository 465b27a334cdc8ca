"""``--lora-modules``: the adapters a server loads at start, each served under its own model name.

Each entry is ``name=path`` or vLLM's JSON form ``{"name": "sql", "path": "/adapters/sql",
"base_model_name": "..."}``. Adapters get ids 1, 2, ... in the order given, and a request whose ``model`` is
an adapter's name runs with that adapter (``/v1/models`` lists each, with its folder as ``root`` and the base
model as ``parent``).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.json_options import json_object_option
from engine.core.lora import LoRARequest


@dataclass(frozen=True, slots=True)
class LoRAModulePath:
    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(text: str) -> LoRAModulePath:
    """One ``--lora-modules`` entry, or a ValueError saying what is wrong with it."""
    if text.lstrip().startswith("{"):
        entry = json_object_option(text, "the entry", ("name", "path", "base_model_name"))
        name, path, base = entry.get("name"), entry.get("path"), entry.get("base_model_name")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise ValueError(f"{text!r} needs a non-empty string 'name' and 'path'")
        if base is not None and not isinstance(base, str):
            raise ValueError(f"{text!r}: base_model_name must be a string, got {base!r}")
        return LoRAModulePath(name, path, base)
    name, separator, path = text.partition("=")
    if not separator or not name or not path:
        raise ValueError(f"{text!r} must be name=path or a JSON object "
                         "'{\"name\": ..., \"path\": ..., \"base_model_name\": ...}'")
    return LoRAModulePath(name, path)


def lora_requests_for(modules: list[LoRAModulePath], served_model_names: list[str]) -> dict[str, LoRARequest]:
    """Adapter name -> its LoRARequest (ids 1, 2, ... in order); a ValueError for a name used twice."""
    requests: dict[str, LoRARequest] = {}
    for module in modules:
        if module.name in requests or module.name in served_model_names:
            raise ValueError(f"adapter name {module.name!r} is used twice (adapters and --served-model-name must "
                             "all differ)")
        requests[module.name] = LoRARequest(module.name, len(requests) + 1, module.path)
    return requests
