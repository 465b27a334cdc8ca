"""What a multi-LoRA run's adapters did: how many requests ran on adapters, how often the engine loaded one,
how much of the step time those loads took, and how the most requested adapters fared.

A LoRA run (sim/lora_steps.py) has a ``lora_name`` column in its requests table (null for base-model requests)
and, in its steps table, each step's adapter tokens and distinct adapters (``num_lora_tokens``,
``num_active_loras``), the adapters it loaded (``num_lora_loads``, ``num_lora_disk_loads``: those read from disk
first) and the seconds those loads took (``lora_load_s``, part of ``duration``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

LORA_STEP_COLUMNS = ("num_lora_tokens", "num_active_loras", "num_lora_loads", "num_lora_disk_loads", "lora_load_s")
# The most requested adapters the summary reports one by one.
NUM_TOP_ADAPTERS = 5


def lora_stats(requests: pd.DataFrame, steps: pd.DataFrame) -> dict[str, Any] | None:
    """``{num_lora_requests, num_base_model_requests, num_adapters_used, adapter_loads, disk_loads, load_s,
    load_share_of_step_time, lora_token_fraction, mean_active_loras, top_adapters}``, else None (no LoRA).

    ``mean_active_loras`` is over the steps with adapter tokens; ``top_adapters`` the NUM_TOP_ADAPTERS most
    requested, each ``{lora_name, num_requests, ttft_ms_p90}`` (TTFT of its finished requests)."""
    from analysis.metrics import completed_mask, latency_stats, request_latencies

    if "lora_name" not in requests.columns or not all(column in steps.columns for column in LORA_STEP_COLUMNS):
        return None
    names = requests["lora_name"]
    on_adapter = names.notna().to_numpy()
    durations = steps["duration"].to_numpy(dtype=np.float64)
    load_s = float(steps["lora_load_s"].to_numpy(dtype=np.float64).sum())
    step_s = float(durations.sum())
    lora_tokens = steps["num_lora_tokens"].to_numpy(dtype=np.int64)
    tokens = int(steps["num_scheduled_tokens"].sum())
    with_adapters = lora_tokens > 0
    counts = names[on_adapter].value_counts()
    latencies = request_latencies(requests)
    finished_names = requests.loc[completed_mask(requests), "lora_name"].to_numpy()
    ttft_s = latencies["ttft_ms"].to_numpy(dtype=np.float64) / 1000.0
    top = []
    for name, count in counts.head(NUM_TOP_ADAPTERS).items():
        top.append({"lora_name": str(name), "num_requests": int(count),
                    "ttft_ms_p90": latency_stats(ttft_s[finished_names == name])["p90"]})
    return {
        "num_lora_requests": int(on_adapter.sum()),
        "num_base_model_requests": int((~on_adapter).sum()),
        "num_adapters_used": int(len(counts)),
        "adapter_loads": int(steps["num_lora_loads"].sum()),
        "disk_loads": int(steps["num_lora_disk_loads"].sum()),
        "load_s": load_s,
        "load_share_of_step_time": load_s / step_s if step_s > 0 else 0.0,
        "lora_token_fraction": float(lora_tokens.sum() / tokens) if tokens else 0.0,
        "mean_active_loras": float(steps["num_active_loras"].to_numpy()[with_adapters].mean())
        if with_adapters.any() else 0.0,
        "top_adapters": top,
    }
