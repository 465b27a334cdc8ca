"""What a run of multi-turn sessions (workload.sessions) did, turn by turn.

A sessions run has ``session_id`` (the session's first request's id) and ``turn`` (1, 2, ...) columns in its
requests table. A later turn resends the conversation, so what matters is how much of it the prefix cache
still held when the turn arrived (``cached_fraction``: cached prompt tokens over prompt tokens) and what that
did to its time to first token. Turns past MAX_TURN_ROWS are pooled into one row, so that a long tail of
turns held by a few sessions does not make a table of rows of one request each.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

SESSION_COLUMNS = ("session_id", "turn")
MAX_TURN_ROWS = 8


def session_stats(requests: pd.DataFrame) -> dict[str, Any] | None:
    """``{num_sessions, num_requests, mean_turns, session_duration_s_p50, session_duration_s_p90, later_turns,
    by_turn}``, else None (no sessions). ``by_turn`` lists ``{turn, num_requests, mean_prompt_tokens,
    cached_fraction, ttft_ms_p50, ttft_ms_p90}`` (the last row, labelled "8+", pools the turns from
    MAX_TURN_ROWS on); ``later_turns`` is the same figures over every turn after the first. A session's duration
    runs from its first turn's arrival to its last turn's finish (sessions with an unfinished turn left out)."""
    from analysis.metrics import completed_mask, latency_stats, request_latencies

    if not all(column in requests.columns for column in SESSION_COLUMNS) or requests["session_id"].isna().all():
        return None
    in_session = requests["session_id"].notna().to_numpy()
    members = requests[in_session]
    turns = members["turn"].to_numpy(dtype=np.int64)
    ttft_s = np.full(len(members), np.nan)
    finished = completed_mask(members)
    ttft_s[finished] = request_latencies(members)["ttft_ms"].to_numpy(dtype=np.float64) / 1000.0

    def figures(mask: np.ndarray) -> dict[str, Any]:
        prompt = members["num_prompt_tokens"].to_numpy(dtype=np.int64)[mask]
        cached = members["num_cached_tokens"].to_numpy(dtype=np.int64)[mask]
        times = ttft_s[mask]
        stats = latency_stats(times[~np.isnan(times)])
        return {"num_requests": int(mask.sum()), "mean_prompt_tokens": float(prompt.mean()) if len(prompt) else 0.0,
                "cached_fraction": float(cached.sum() / prompt.sum()) if prompt.sum() else 0.0,
                "ttft_ms_p50": stats["p50"], "ttft_ms_p90": stats["p90"]}

    by_turn = []
    for turn in range(1, min(int(turns.max()), MAX_TURN_ROWS) + 1):
        mask = turns == turn if turn < MAX_TURN_ROWS else turns >= turn
        label: int | str = turn if turn < MAX_TURN_ROWS or int(turns.max()) == turn else f"{turn}+"
        by_turn.append({"turn": label, **figures(mask)})
    sessions = members.assign(done=finished).groupby("session_id", sort=False).agg(
        start=("arrival_time", "min"), end=("finish_time", "max"), complete=("done", "all"))
    durations = (sessions["end"] - sessions["start"])[sessions["complete"]].to_numpy(dtype=np.float64)
    return {
        "num_sessions": int(len(sessions)),
        "num_requests": int(len(members)),
        "mean_turns": float(len(members) / len(sessions)),
        "session_duration_s_p50": float(np.percentile(durations, 50)) if len(durations) else None,
        "session_duration_s_p90": float(np.percentile(durations, 90)) if len(durations) else None,
        "later_turns": figures(turns > 1),
        "by_turn": by_turn,
    }
