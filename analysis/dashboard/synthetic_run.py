"""Synthetic run directories of any size, for testing dashboards and measuring their size and speed.

Not a simulator: numbers are drawn so that the traces have the right shape (arrivals at a rate,
queueing, prefill, decode with per-token timestamps, engine steps with queue, batch, KV usage,
preemptions and prefix hits) and are internally consistent enough for every figure to have
something to draw. Building 10,000 requests takes about a second, which a simulation of that size
would not in a unit test.

`step_noise` > 0 makes a "measured" twin of a run: the same steps and requests (same seed), each
step's duration and each request's timestamps perturbed, as a real run beside its simulation would be.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from analysis.metrics import compute_summary
from analysis.run_dir import write_run
from analysis.trace_schema import requests_table, steps_table

STEP_SECONDS = 0.02
DEFAULT_SLO = {"ttft_ms": 500.0, "tpot_ms": 50.0}


def synthetic_run(
    out_dir: str | Path,
    *,
    num_requests: int = 200,
    rate: float = 10.0,
    seed: int = 0,
    name: str = "synthetic",
    mode: str = "sim",
    step_noise: float = 0.0,
    max_output_tokens: int = 128,
    config: Mapping[str, Any] | None = None,
    slo: Mapping[str, float] | None = DEFAULT_SLO,
) -> Path:
    """Write a synthetic run directory and return its path."""
    generator = np.random.default_rng(seed)
    # Load grows with the rate, so a sweep over `rate` has latencies that rise with it.
    load = rate / (rate + 20.0)
    arrival = np.cumsum(generator.exponential(1.0 / rate, num_requests))
    queue = generator.exponential(0.005 + 0.5 * load ** 3, num_requests)
    num_prompt = np.clip(generator.lognormal(6.0, 0.7, num_requests).astype(np.int64), 8, 4096)
    prefill = 0.01 + num_prompt * 2e-5
    num_output = generator.integers(1, max_output_tokens + 1, num_requests)
    inter_token = 0.008 + 0.02 * load

    offsets = np.zeros(num_requests + 1, dtype=np.int64)
    np.cumsum(num_output, out=offsets[1:])
    gaps = generator.exponential(inter_token, int(offsets[-1]))
    # The measured twin: the same draws as the simulated run, then its own noise on top. Its steps
    # are the simulated run's steps (same count): only their durations differ.
    noise = np.random.default_rng(seed + 1_000_003)
    jitter = (lambda size: noise.lognormal(0.0, step_noise, size)) if step_noise > 0 else (lambda size: np.ones(size))
    simulated_end = float((arrival + queue + prefill).max() + np.add.reduceat(gaps, offsets[:-1]).max())
    scheduled = arrival + queue * jitter(num_requests)
    first_token = scheduled + prefill * jitter(num_requests)
    gaps = gaps * jitter(gaps.size)
    owner = np.repeat(np.arange(num_requests), num_output)
    gaps[offsets[:-1]] = 0.0  # the first token is at first_token_time itself
    cumulative = np.cumsum(gaps)
    token_times = first_token[owner] + cumulative - cumulative[offsets[:-1]][owner]
    finish = token_times[offsets[1:] - 1]
    token_lists = [token_times[offsets[index]:offsets[index + 1]] for index in range(num_requests)]
    num_cached = (num_prompt * generator.uniform(0.0, 0.6, num_requests)).astype(np.int64) // 16 * 16
    requests = {
        "request_id": [f"req-{index}" for index in range(num_requests)],
        "arrival_time": arrival,
        "scheduled_time": scheduled,
        "first_token_time": first_token,
        "finish_time": finish,
        "num_prompt_tokens": num_prompt,
        "num_output_tokens": num_output,
        "num_cached_tokens": num_cached,
        "num_preemptions": (generator.random(num_requests) < 0.02).astype(np.int64),
        "finish_reason": np.where(num_output == max_output_tokens, "length", "stop").tolist(),
        "token_times": token_lists,
    }
    steps = _steps(generator, simulated_end, load, jitter)
    summary = compute_summary(
        requests_table(requests).to_pandas(), steps_table(steps).to_pandas(), name=name, mode=mode,
        config=dict(config) if config is not None else {"workload": {"arrival": {"type": "poisson", "rate": rate}},
                                                         "engine": {"max_num_seqs": 256}},
        slo=slo,
    )
    return write_run(out_dir, requests, steps, summary)


def _steps(generator: np.random.Generator, duration: float, load: float, jitter) -> dict[str, np.ndarray]:
    num_steps = max(int(duration / STEP_SECONDS), 1)
    start = np.arange(num_steps) * STEP_SECONDS
    waiting = np.maximum(np.cumsum(generator.normal(0.0, 1.0, num_steps)) * load, 0.0).astype(np.int64)
    running = np.clip(20 + np.cumsum(generator.normal(0.0, 0.5, num_steps)), 1, 256).astype(np.int64)
    prefill_tokens = np.where(generator.random(num_steps) < 0.2, generator.integers(16, 4096, num_steps), 0)
    scheduled_tokens = running + prefill_tokens
    kv_usage = np.clip(0.35 + 0.6 * load + 0.15 * np.sin(start / 7.0) + generator.normal(0, 0.02, num_steps), 0, 1)
    # The cache preempts when it is nearly full: at rate 30 (load 0.6) a few hundred times.
    preemptions = np.where((kv_usage > 0.82) & (generator.random(num_steps) < 0.1), 1, 0)
    queries = np.where(prefill_tokens > 0, prefill_tokens, 0)
    return {
        "step": np.arange(num_steps),
        "start_time": start,
        # Each step is predicted (or measured) to take a little less than the gap to the next one.
        "duration": STEP_SECONDS * (0.6 + 0.3 * load + 0.0002 * (scheduled_tokens % 100)) * jitter(num_steps),
        "num_prefill_reqs": (prefill_tokens > 0).astype(np.int64),
        "num_decode_reqs": running,
        "num_scheduled_tokens": scheduled_tokens,
        "num_prefill_tokens": prefill_tokens,
        "num_context_tokens": running * 600 + prefill_tokens,
        "num_running": running,
        "num_waiting": waiting,
        "kv_blocks_used": (kv_usage * 10_000).astype(np.int64),
        "kv_usage": kv_usage,
        "num_preemptions": preemptions,
        "prefix_hit_tokens": (queries * generator.uniform(0.0, 0.5, num_steps)).astype(np.int64),
        "prefix_query_tokens": queries,
    }
