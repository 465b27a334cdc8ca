"""Options given as a JSON object on the command line or as a dict in Python (vLLM's ``--speculative-config``,
``--pooler-config``, ``--lora-modules '{...}'``): one parser, so they all accept the same forms and name the
option, and any key they do not know, the same way. Pure Python (the core's pooling parameters use it)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def json_object_option(value: Any, what: str, known: Iterable[str]) -> dict[str, Any]:
    """``value`` (a dict, or the JSON text of one) as a dict holding only ``known`` keys; a ValueError naming
    ``what`` otherwise. Required keys and the values' types are the caller's to check."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise ValueError(f"{what} must be a JSON object, got {value!r} ({error})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a JSON object, got {value!r}")
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ValueError(f"{what} has unknown key(s) {unknown}; known: {sorted(known)}")
    return value
