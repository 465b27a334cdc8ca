"""A hand-built run small enough to check every metric by hand.

    request  arrival scheduled first_token finish  tokens  token_times            reason
    r0       0.0     0.1       0.5         1.5     3       0.5 1.0 1.5            stop
    r1       1.0     1.2       1.4         2.0     4       1.4 1.6 1.8 2.0        length
    r2       2.0     2.0       2.3         2.3     1       2.3                    stop
    r3       2.5     never     never       3.0     0       -                      abort

Per completed request (ms): TTFT 500 400 300; TPOT 500 200 (r2 has one token); E2E 1500 1000 300;
queue 100 200 0; ITL gaps 500 500 200 200 200. Duration 0.0 -> 3.0 s.

    step start duration kv_usage hits queries preemptions
    0    0.0   1.0      0.2      0    10      0
    1    1.0   0.5      0.6      16   20      1
    2    1.5   1.5      0.4      0    10      0

Hit rate 16/40 = 0.4; time-weighted KV usage (0.2*1 + 0.6*0.5 + 0.4*1.5) / 3 = 1.1/3.
"""

from __future__ import annotations

import math

import pytest

NAN = math.nan


@pytest.fixture
def request_columns() -> dict[str, list]:
    return {
        "request_id": ["r0", "r1", "r2", "r3"],
        "arrival_time": [0.0, 1.0, 2.0, 2.5],
        "scheduled_time": [0.1, 1.2, 2.0, NAN],
        "first_token_time": [0.5, 1.4, 2.3, NAN],
        "finish_time": [1.5, 2.0, 2.3, 3.0],
        "num_prompt_tokens": [10, 20, 10, 5],
        "num_output_tokens": [3, 4, 1, 0],
        "num_cached_tokens": [0, 16, 0, 0],
        "num_preemptions": [0, 1, 0, 0],
        "finish_reason": ["stop", "length", "stop", "abort"],
        "priority": [0, 0, 1, 0],
        "token_times": [[0.5, 1.0, 1.5], [1.4, 1.6, 1.8, 2.0], [2.3], []],
    }


@pytest.fixture
def step_columns() -> dict[str, list]:
    return {
        "step": [0, 1, 2],
        "start_time": [0.0, 1.0, 1.5],
        "duration": [1.0, 0.5, 1.5],
        "num_prefill_reqs": [1, 1, 1],
        "num_decode_reqs": [0, 1, 1],
        "num_scheduled_tokens": [10, 5, 11],
        "num_prefill_tokens": [10, 4, 10],
        "num_context_tokens": [10, 30, 40],
        "num_running": [1, 2, 2],
        "num_waiting": [0, 0, 1],
        "kv_blocks_used": [2, 6, 4],
        "kv_usage": [0.2, 0.6, 0.4],
        "num_preemptions": [0, 1, 0],
        "prefix_hit_tokens": [0, 16, 0],
        "prefix_query_tokens": [10, 20, 10],
        "prefill_attention_work": [100.0, 16.0, 100.0],
        "decode_context_tokens": [0, 11, 21],
    }
