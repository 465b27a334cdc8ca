"""Popularity over a pool of items (LoRA adapters, images): ``uniform`` or ``{zipf: s}``, item i drawn in proportion
to ``1 / (i + 1) ** s``; and drawing items by it. Shared by workload.lora and workload.images."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def parse_popularity(value: Any, names: tuple[str, ...], item_phrase: str) -> Any:
    """``value`` if it is one of ``names`` or ``{zipf: s}`` with s > 0 (returned as a float), else ValueError.
    ``item_phrase`` says what item i is, e.g. "adapter i picked"."""
    if value in names:
        return value
    exponent = value.get("zipf") if isinstance(value, dict) and set(value) == {"zipf"} else None
    if (exponent is None or isinstance(exponent, bool) or not isinstance(exponent, (int, float))
            or not math.isfinite(exponent) or exponent <= 0):
        listed = " or ".join([", ".join(repr(name) for name in names), "{zipf: s}"])
        raise ValueError(f"must be {listed} with an exponent s > 0 ({item_phrase} in proportion to 1 / (i + 1) ** s)")
    return {"zipf": float(exponent)}


def popularity_weights(popularity: Any, count: int) -> np.ndarray:
    """Each of ``count`` items' weight: 1 for a named (not Zipf) popularity, else ``1 / (i + 1) ** s``."""
    if isinstance(popularity, dict):
        return 1.0 / np.arange(1, count + 1, dtype=np.float64) ** popularity["zipf"]
    return np.ones(count)


def pick_by_weights(weights: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """The item each uniform draw in [0, 1) lands on, by the weights' cumulative sum."""
    cumulative = np.cumsum(weights)
    return np.minimum(np.searchsorted(cumulative, uniforms * cumulative[-1], side="right"), len(weights) - 1)
