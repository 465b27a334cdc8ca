"""Reading a Hugging Face ``config.json`` into a dict, with the errors a workload's ``model:`` field reports."""

from __future__ import annotations

import json
from pathlib import Path


def read_config_json(path: Path) -> dict:
    """The JSON object in ``path``; ValueError naming ``model:`` and the file for anything else."""
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"model: cannot read {path} as JSON: {error}") from None
    if not isinstance(config, dict):
        raise ValueError(f"model: {path} does not hold a JSON object")
    return config
