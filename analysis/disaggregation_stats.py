"""Where a disaggregated run's time to first token goes: prefill, the wait for the KV load, the load, and
the decode replica's first step after it.

A disaggregated run's requests table (sim/disaggregation.py) carries, beside the user's timestamps, when
the prefill replica finished the prompt (``prefill_end_time``) and when the decode replica's load of its KV
started and ended. For each request that was handed off:

    TTFT = prefill_ms (arrival -> prefill end: queue and prompt on the prefill replica)
         + kv_wait_ms (-> load start: the decode replica's queue, its pool, and its link's queue)
         + kv_load_ms (-> load end: latency + bytes / bandwidth)
         + first_token_ms (-> first token: the next decode step that schedules it, and that step)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

DISAGGREGATION_COLUMNS = ("prefill_replica", "prefill_end_time", "kv_load_start_time", "kv_load_end_time",
                          "kv_load_tokens")
# (summary key, later timestamp, earlier timestamp): the parts of TTFT, in order.
TTFT_PARTS = (
    ("prefill_ms", "prefill_end_time", "arrival_time"),
    ("kv_wait_ms", "kv_load_start_time", "prefill_end_time"),
    ("kv_load_ms", "kv_load_end_time", "kv_load_start_time"),
    ("first_token_ms", "first_token_time", "kv_load_end_time"),
)


def disaggregation_stats(requests: pd.DataFrame) -> dict[str, Any] | None:
    """``{num_kv_loads, kv_load_tokens, prefill_ms, kv_wait_ms, kv_load_ms, first_token_ms}`` (each a
    latency_stats over the handed-off requests) for a disaggregated run's requests, else None."""
    from analysis.metrics import latency_stats

    if not all(column in requests.columns for column in DISAGGREGATION_COLUMNS):
        return None
    loaded = requests.loc[np.isfinite(requests["kv_load_end_time"].to_numpy(dtype=np.float64))]
    stats: dict[str, Any] = {
        "num_kv_loads": int(len(loaded)),
        "kv_load_tokens": int(loaded["kv_load_tokens"].sum()),
    }
    for key, later, earlier in TTFT_PARTS:
        seconds = loaded[later].to_numpy(dtype=np.float64) - loaded[earlier].to_numpy(dtype=np.float64)
        stats[key] = latency_stats(seconds)
    return stats
