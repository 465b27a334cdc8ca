"""What a run with images did with them: how many it showed, how many its vision encoder computed, and how the
requests that showed images fared against the text-only ones.

A run with images (workloads/images.py) has ``num_images`` and ``num_image_tokens`` columns in its requests table
and, in its steps table, the images each step encoded and their encoder tokens (``num_encoder_items``,
``num_encoder_tokens``). An image shown but not encoded was served from the encoder cache, or needed no encoder
at all because its KV was a prefix-cache hit (engine/core/encoder_cache_manager.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

MULTIMODAL_REQUEST_COLUMNS = ("num_images", "num_image_tokens")
MULTIMODAL_STEP_COLUMNS = ("num_encoder_items", "num_encoder_tokens")


def multimodal_stats(requests: pd.DataFrame, steps: pd.DataFrame) -> dict[str, Any] | None:
    """``{num_image_requests, images_shown, image_tokens_shown, images_encoded, encoder_tokens,
    encoder_tokens_saved_fraction, encoding_steps, ttft_ms_p50_with_images, ttft_ms_p50_text_only}``, else None.

    ``encoder_tokens_saved_fraction``: the share of the shown images' tokens the encoder did not compute (kept
    outputs and prefix-cache hits; a preempted request's images may be encoded again, which lowers it)."""
    from analysis.metrics import completed_mask, latency_stats, request_latencies

    if not all(column in requests.columns for column in MULTIMODAL_REQUEST_COLUMNS) \
            or not all(column in steps.columns for column in MULTIMODAL_STEP_COLUMNS):
        return None
    counts = requests["num_images"].to_numpy(dtype=np.int64)
    shown_tokens = int(requests["num_image_tokens"].sum())
    encoded_tokens = int(steps["num_encoder_tokens"].sum())
    latencies = request_latencies(requests)
    with_images = set(requests.loc[counts > 0, "request_id"]) & set(requests.loc[completed_mask(requests), "request_id"])
    shows = latencies["request_id"].isin(with_images).to_numpy()
    ttft_seconds = latencies["ttft_ms"].to_numpy(dtype=np.float64) / 1000.0
    return {
        "num_image_requests": int((counts > 0).sum()),
        "images_shown": int(counts.sum()),
        "image_tokens_shown": shown_tokens,
        "images_encoded": int(steps["num_encoder_items"].sum()),
        "encoder_tokens": encoded_tokens,
        "encoder_tokens_saved_fraction": None if not shown_tokens else 1.0 - encoded_tokens / shown_tokens,
        "encoding_steps": int((steps["num_encoder_items"].to_numpy(dtype=np.int64) > 0).sum()),
        "ttft_ms_p50_with_images": latency_stats(ttft_seconds[shows])["p50"],
        "ttft_ms_p50_text_only": latency_stats(ttft_seconds[~shows])["p50"],
    }
