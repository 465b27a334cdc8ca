"""What a run's host tier of the prefix cache (KV offloading) did: how much prompt KV it loaded instead of
the engine recomputing it, and how long the loads took.

A run with offloading (sim/kv_offload_loads.py) has two columns in its requests table: the tokens each request
loaded from the host (``offload_loaded_tokens``; a request preempted and resumed may load again) and the
seconds its loads took from start to end, waiting for the link included (``offload_load_s``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

OFFLOAD_COLUMNS = ("offload_loaded_tokens", "offload_load_s")


def offload_stats(requests: pd.DataFrame) -> dict[str, Any] | None:
    """``{num_requests_loaded, loaded_tokens, loaded_token_fraction, load_ms}`` (loaded tokens over every
    request's prompt tokens; load_ms a latency_stats over the requests that loaded), else None."""
    from analysis.metrics import latency_stats

    if not all(column in requests.columns for column in OFFLOAD_COLUMNS):
        return None
    loaded_tokens = requests["offload_loaded_tokens"].to_numpy(dtype=np.int64)
    loaded = loaded_tokens > 0
    prompt_tokens = int(requests["num_prompt_tokens"].sum())
    return {
        "num_requests_loaded": int(loaded.sum()),
        "loaded_tokens": int(loaded_tokens.sum()),
        "loaded_token_fraction": float(loaded_tokens.sum() / prompt_tokens) if prompt_tokens else 0.0,
        "load_ms": latency_stats(requests["offload_load_s"].to_numpy(dtype=np.float64)[loaded]),
    }
