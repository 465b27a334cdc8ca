"""Turn metric dictionaries into values the json module writes as strict JSON.

Summaries are built from numpy and pandas results, so they hold numpy scalars, numpy arrays and NaN.
`json.dumps` rejects the first two and writes NaN as the non-standard token `NaN`, which browsers and
other tools refuse; a missing number is written as null instead.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

import numpy as np


def json_safe(value: Any) -> Any:
    """Return a copy of `value` made only of dict, list, str, int, float (finite), bool and None."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, enum.Enum):
        return json_safe(value.value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (float, np.floating)):
        number = float(value)
        return number if math.isfinite(number) else None
    if isinstance(value, Mapping):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, np.ndarray):
        return [json_safe(item) for item in value.tolist()]
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(item) for item in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json_safe(dataclasses.asdict(value))
    if isinstance(value, PurePath):
        return str(value)
    # pandas.NA / NaT and anything pandas considers missing.
    try:
        import pandas as pd

        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    return str(value)
