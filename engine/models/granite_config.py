"""Granite's four scalars (granite.py applies them), read from config.json with transformers' defaults."""

from __future__ import annotations

from typing import Any

MULTIPLIERS = ("embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling")


def granite_multipliers(raw: dict[str, Any]) -> dict[str, float]:
    """The four scalars (1.0 each when absent), each a positive number."""
    values = {}
    for key in MULTIPLIERS:
        value = raw.get(key, 1.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"config.json: {key} must be a positive number, got {value!r}")
        values[key] = float(value)
    return values
